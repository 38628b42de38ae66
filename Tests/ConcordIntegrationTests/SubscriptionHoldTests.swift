import ConcordJSON
import Synchronization
import Testing

@testable import ConcordClient

/// A resubscription holds a subscription's events until its answer is
/// handed over. When the connection is replaced while a pass is under way,
/// the stale pass must not end the newer pass's hold (seen as a rare loss of
/// a collection insert after a server restart, under load).
@Suite struct SubscriptionHoldTests {
    @Test func aStaleResubscriptionDoesNotEndANewerOnesHold() {
        let (_, continuation) = AsyncStream<ConcordEvent>.makeStream()
        let got = Mutex<[Int]>([])
        let s = SubscriptionState(name: "people", target: .collection("people"), continuation: continuation) { e in
            got.withLock { $0.append(e.seq) }
        }
        let stale = s.holdEvents()   // the pass on a connection that then dropped
        let fresh = s.holdEvents()   // the pass on the new connection
        s.yield(.collection(seq: 5, [], context: nil))  // follows the fresh answer: held
        s.dropHeld(stale)            // the stale pass fails
        s.releaseHeld(stale, first: .resynced(seq: 1, state: []))  // or finishes late: nothing of it is delivered
        #expect(got.withLock { $0 }.isEmpty)
        s.releaseHeld(fresh, first: .resynced(seq: 4, state: []))
        #expect(got.withLock { $0 } == [4, 5])
        // No hold: delivered at once.
        s.yield(.collection(seq: 6, [], context: nil))
        #expect(got.withLock { $0 } == [4, 5, 6])
        continuation.finish()
    }

    /// An event the reader thread yields while the held ones are being
    /// delivered waits its turn: it never overtakes the resynced state.
    @Test func anEventDuringTheReleaseComesAfterWhatWasHeld() {
        let (_, continuation) = AsyncStream<ConcordEvent>.makeStream()
        let got = Mutex<[Int]>([])
        final class Box: @unchecked Sendable { var s: SubscriptionState? }
        let box = Box()
        let s = SubscriptionState(name: "people", target: .collection("people"), continuation: continuation) { e in
            // The reader thread's next event arrives while this one is handled.
            if e.seq == 4 { box.s?.yield(.collection(seq: 6, [], context: nil)) }
            got.withLock { $0.append(e.seq) }
        }
        box.s = s
        let hold = s.holdEvents()
        s.yield(.collection(seq: 5, [], context: nil))
        s.releaseHeld(hold, first: .resynced(seq: 4, state: []))
        #expect(got.withLock { $0 } == [4, 5, 6])
        continuation.finish()
        box.s = nil  // the handler holds the box, the box the subscription
    }
}
