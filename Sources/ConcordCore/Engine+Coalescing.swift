import Synchronization
import ConcordJSON

/// Slow connections (PROTOCOL.md §6.6).
///
/// When a connection's unsent output passes `outputSoftBytes`, every one of
/// its subscriptions is held back the way `pause` holds one back: it keeps
/// only what a `resume` would send (the value it was last sent, and whether
/// and with which context it changed since). Nothing more is queued for it
/// until the driver reports the output drained (`outputDrained`), when each
/// changed subscription gets one event marked `"coalesced":true`. View-ending
/// `delete` events and responses are never held back; a response is written
/// only after the coalesced events it must follow (they are flushed first).
/// Memory per slow connection is then bounded by its subscriptions' state,
/// not by the number of mutations.
extension Engine {
    /// Starts holding back the connection's events (between mutations, so
    /// every baseline is exactly what was queued).
    func beginCoalescing(_ c: ClientSession) {
        nextCoalescingEpisode += 1
        c.coalescing = nextCoalescingEpisode
        c.flow.coalescing.store(nextCoalescingEpisode, ordering: .relaxed)
        coalescingEpisodes += 1
        for s in c.subs.values {
            if let p = s.pause { p.byCongestion = true } else { holdBack(s) }
        }
    }

    /// Holds one running subscription back from what it was last sent.
    func holdBack(_ s: SubscriptionRecord) {
        let state = baseline(s)
        state.byCongestion = true
        s.pause = state
    }

    /// A paused or held-back subscription's view changed: its catch-up
    /// carries `context`, and a held-back one is owed a coalesced event.
    @inline(__always)
    func noteChange(_ s: SubscriptionRecord, _ p: PauseState, context: JSON?) {
        p.changed = true
        p.context = context
        noteHeldBack(s, p)
    }

    /// A held-back subscription changed: it is owed a coalesced event.
    @inline(__always)
    func noteHeldBack(_ s: SubscriptionRecord, _ p: PauseState) {
        if p.byCongestion && !p.byUser && !p.listed {
            p.listed = true
            s.client.coalesced.append(s)
        }
    }

    /// Before any mutation: a connection this turn has already queued too much
    /// for starts coalescing now, not after the turn.
    func checkCongestion() {
        guard !congested.isEmpty else { return }
        let soft = configuration.outputSoftBytes
        for c in congested {
            c.congested = false
            if c.coalescing == 0, c.output.byteCount + c.flow.unsent.load(ordering: .relaxed) > soft, clients[c.id] === c {
                beginCoalescing(c)
            }
        }
        congested.removeAll(keepingCapacity: true)
    }

    /// Writes one coalesced event for every held-back subscription that changed.
    func flushCoalesced(_ c: ClientSession) {
        let list = c.coalesced
        c.coalesced = []
        for s in list {
            guard let p = s.pause else { continue }
            p.listed = false
            guard !p.byUser, c.subs[s.name] === s else { continue }
            s.pause = nil
            writeCatchUp(s, p, coalesced: true)
            coalescedEvents += 1
            if c.coalescing != 0 { holdBack(s) }
        }
    }

    /// The driver wrote the connection's output down below its low-water
    /// mark during coalescing episode `episode`: catch every subscription up
    /// and queue events one by one again.
    public func outputDrained(_ id: ConnectionID, episode: Int) {
        guard episode != 0, let c = clients[id], c.coalescing == episode else { return }
        c.coalescing = 0
        c.flow.coalescing.store(0, ordering: .relaxed)
        flushCoalesced(c)
        for s in c.subs.values {
            guard let p = s.pause, p.byCongestion else { continue }
            if p.byUser { p.byCongestion = false } else { s.pause = nil }
        }
    }

    /// True while the connection's events are being coalesced.
    public func isCoalescing(_ id: ConnectionID) -> Bool { (clients[id]?.coalescing ?? 0) != 0 }
}
