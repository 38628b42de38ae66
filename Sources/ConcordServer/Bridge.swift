import CLibUV

#if canImport(Glibc)
import Glibc
#endif

/// Hand-off from the sequencer thread to the loop: deliveries queue here
/// and one `uv_async_send` (which coalesces) wakes the loop for all of them.
final class Bridge: @unchecked Sendable {
    // Sendable: `pending` is guarded by `condition`; `async` is only passed to
    // uv_async_send, the one libuv call that is safe from any thread.
    private let condition = Condition()
    private var pending: [Sequencer.Delivery] = []
    private var closed = false
    let async: UnsafeMutablePointer<uv_async_t>

    init(async: UnsafeMutablePointer<uv_async_t>) { self.async = async }

    func post(_ d: Sequencer.Delivery) {
        condition.lock()
        defer { condition.unlock() }
        // After shutdown the async handle is gone; late output has no reader left.
        guard !closed else { return }
        pending.append(d)
        uvMust("uv_async_send", uv_async_send(async))
    }

    /// Called on the loop before the async handle is closed.
    func close() {
        condition.lock()
        closed = true
        condition.unlock()
    }

    /// Hands over what was posted: `taken` (emptied by the caller, its
    /// storage kept) and the pending list trade places, so neither side
    /// allocates a list per hand-off.
    func take(into taken: inout [Sequencer.Delivery]) {
        condition.lock()
        defer { condition.unlock() }
        swap(&taken, &pending)
    }
}
