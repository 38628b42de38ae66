import ConcordJSON
import ConcordProtocol

/// One client session as the core sees it.
final class ClientSession {
    let id: ConnectionID
    var subs = NameTable<SubscriptionRecord>()
    /// The paused subscriptions' states, by subscription (``SubscriptionRecord/pause``).
    var pauses: [ObjectIdentifier: PauseState] = [:]
    var output = OutputQueue()
    var dirty = false
    /// Listed in `Engine.congested` (its queued bytes passed the soft limit since the last check).
    var congested = false
    /// Lines read while an earlier request of this connection waits (read-through
    /// load, or a sync acknowledgement): answered in order once it is done.
    var backlog: [Engine.ParsedLine] = []
    var backlogHead = 0
    var waitingTicket: Int?
    var waitingDurable: Int?
    var heldResponse: (rid: JSON, bytes: [UInt8])?
    /// Shared with the driver: bytes it has not written yet, bytes it read that we did not take.
    let flow: ConnectionFlow
    /// At least `flow.unsent`: its value when the core last added to it
    /// (`takeOutput`; only the driver writes it otherwise, and only
    /// subtracts). The fan-out's congestion check reads this, not the
    /// counter, whose cache line the event loop writes on every write.
    var unsentBound = 0
    /// Non-zero while this connection's events are coalesced (§6.6): the episode number.
    var coalescing = 0
    /// Subscriptions that changed while coalescing (each listed once).
    var coalesced: [SubscriptionRecord] = []
    /// For the operator (`stats` with `clients`): the name from `hello`, the
    /// peer process, when the connection opened, requests answered.
    var name: String?
    var peer: PeerCredentials?
    var openedAt = 0.0
    var requests = 0
    /// Closed by the driver: nothing is written to it any more, and its
    /// subscriptions still to end are in `closing` (Engine.close).
    var closed = false
    var closing: [SubscriptionRecord] = []

    init(id: ConnectionID, flow: ConnectionFlow) {
        self.id = id
        self.flow = flow
    }

    /// A request with `min_seq` past the applied seq: until when it waits, and its rid.
    var waitingSeq: (minSeq: Int, deadline: Double, rid: JSON)?

    /// Cluster mode: this connection's mutations in the log, oldest first
    /// (answered in this order), and failures that arrived for one behind
    /// an older one still in the log (answered when it is their turn).
    var logPending: [Int] = []
    var logFailures: [Int: (rid: JSON, error: ProtocolError)] = [:]
    /// Cluster mode: a `sync` (or a `since` past the applied seq) waiting for the log's head.
    var waitingSync: SyncWait?
    /// The head request is run again after its sync wait (it must not wait again).
    var rerunAfterSync = false

    var isWaiting: Bool { waitingTicket != nil || waitingDurable != nil || waitingSeq != nil || !logPending.isEmpty || waitingSync != nil }

    /// Waits only for its own mutations in the log, with nothing queued
    /// behind them: a further mutation may go to the log at once (it will be
    /// applied, and answered, after them).
    var onlyLogPending: Bool { waitsOnlyForLog && backlogHead == backlog.count }

    /// Waits for its own mutations in the log and for nothing else.
    var waitsOnlyForLog: Bool {
        !logPending.isEmpty && waitingTicket == nil && waitingDurable == nil && waitingSeq == nil && waitingSync == nil
    }

    func popBacklog() -> Engine.ParsedLine? {
        guard backlogHead < backlog.count else { return nil }
        let line = backlog[backlogHead]
        backlogHead += 1
        if backlogHead == backlog.count {
            backlog.removeAll(keepingCapacity: true)
            backlogHead = 0
        }
        return line
    }
}
