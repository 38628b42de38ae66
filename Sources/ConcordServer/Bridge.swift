import CLibUV
import ConcordCore
import ConcordProtocol

#if canImport(Glibc)
import Glibc
#endif

/// Hand-off from the sequencer thread to the loop: deliveries queue here
/// and one wake-up (``LoopWakeup``, which coalesces) wakes the loop for all
/// of them.
final class Bridge: @unchecked Sendable {
    // Sendable: `pending` is guarded by `condition`; `wakeup` is thread-safe.
    private let condition = Condition()
    private var pending: [Sequencer.Delivery] = []
    private var closed = false
    let wakeup: LoopWakeup

    init(wakeup: LoopWakeup) { self.wakeup = wakeup }

    /// Emptied lists on their way back to the thread that fills them.
    private var spares = SpareLists()

    func post(_ d: Sequencer.Delivery) {
        condition.lock()
        let posted = postLocked(d)
        condition.unlock()
        if posted { wakeup.wake() }
    }

    /// `post`, and under the same lock the sequencer's spares trade places
    /// with what the loop gave back: it leaves the frame lists it emptied
    /// and takes the delivery lists the loop emptied.
    func post(_ d: Sequencer.Delivery, exchanging mine: inout SpareLists) {
        condition.lock()
        guard postLocked(d) else {
            condition.unlock()
            return
        }
        SpareLists.give(&mine.frames, to: &spares.frames)
        SpareLists.give(&spares.outputs, to: &mine.outputs)
        SpareLists.give(&spares.chunks, to: &mine.chunks)
        SpareLists.give(&spares.stamps, to: &mine.stamps)
        condition.unlock()
        wakeup.wake()
    }

    /// Queues `d` (the lock held); false after shutdown: the loop no longer
    /// polls, and late output has no reader left. The caller wakes the
    /// loop once it has let go of the lock: woken under it, the loop often
    /// reached `take` while the sender was still in its `write` and slept
    /// on the lock (a futex round trip more per delivery). Outside it is
    /// safe: a `take` that runs first sees the delivery (queued before the
    /// unlock), and the wake-up then finds nothing; the eventfd lives as
    /// long as this bridge.
    private func postLocked(_ d: Sequencer.Delivery) -> Bool {
        guard !closed else { return false }
        pending.append(d)
        return true
    }

    /// Called on the loop before its poll of the wake-up is closed.
    func close() {
        condition.lock()
        closed = true
        condition.unlock()
    }

    /// Hands over what was posted: `taken` (emptied by the caller, its
    /// storage kept) and the pending list trade places, so neither side
    /// allocates a list per hand-off. Under the same lock the loop's spares
    /// trade places with the sequencer's: it leaves the delivery lists it
    /// emptied and takes the frame lists the sequencer emptied.
    func take(into taken: inout [Sequencer.Delivery], exchanging mine: inout SpareLists) {
        condition.lock()
        defer { condition.unlock() }
        swap(&taken, &pending)
        SpareLists.give(&mine.outputs, to: &spares.outputs)
        SpareLists.give(&mine.chunks, to: &spares.chunks)
        SpareLists.give(&mine.stamps, to: &spares.stamps)
        SpareLists.give(&spares.frames, to: &mine.frames)
    }
}

/// Lists the loop and the sequencer hand each other full and give back
/// empty, their storage kept, so that a turn of one request allocates none
/// of them: a read's frames (loop → sequencer), a delivery's outputs, each
/// connection's chunks and the latency stamps (sequencer → loop). They go
/// back through the ``Bridge`` under the lock its hand-offs take anyway.
///
/// Bounded: at most ``maxLists`` lists of each kind wait here or on either
/// side, each with room for at most ``maxCapacity`` entries (a burst's big
/// lists are freed, not kept).
struct SpareLists {
    var frames: [[LineFramer.Frame]] = []
    var outputs: [[(ConnectionID, [OutputChunk])]] = []
    var chunks: [[OutputChunk]] = []
    var stamps: [[Double]] = []

    static let maxLists = 32
    static let maxCapacity = 1024

    /// Keeps `list` (emptied here) if it has room worth keeping and there is room for it.
    @inline(__always)
    static func keep<T>(_ list: inout [T], in kept: inout [[T]]) {
        guard list.capacity > 0, list.capacity <= maxCapacity, kept.count < maxLists else { return }
        list.drain()
        kept.append(list)
        list = []
    }

    /// Moves lists from `from` to `to` (at most up to the bound); what does not fit is freed.
    @inline(__always)
    static func give<T>(_ from: inout [[T]], to: inout [[T]]) {
        if from.isEmpty { return }
        if to.isEmpty {
            swap(&from, &to)
            return
        }
        while to.count < maxLists, let l = from.popLast() { to.append(l) }
        from.drain()
    }
}
