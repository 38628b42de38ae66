import CLibUV
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Wakes the loop thread from another thread: an `eventfd` the loop polls
/// (a `uv_poll_t`, ``Server``), written at most once per wake-up.
///
/// Not `uv_async_t`: libuv 1.44's (Debian 12's) `uv_async_send` marks its
/// handle busy, writes the loop's eventfd, then marks it done, and the
/// loop, woken by that write, spins — up to 997 `pause` instructions, then
/// `sched_yield`, again and again — until the sender has marked it done.
/// On this 2-vCPU VM the woken loop often ran before the sender came back
/// from its `write`: a request that arrived alone cost the loop ~1.9k
/// instructions of spinning per wake-up, with a `sched_yield` on one in
/// four (each a full 997-`pause` round, some 40 µs of CPU burnt). Here the
/// sender's only step after its `write` is none, so the loop never waits
/// for it.
///
/// The protocol: `wake` arms a flag and writes only when it was not armed;
/// the loop, in its poll callback, reads the counter, disarms, and then
/// takes what was posted (``Bridge/take``). A post that found the flag
/// armed was queued before the loop disarmed it, so the take after the
/// disarm sees it; one after the disarm writes again (at worst a wake-up
/// that finds nothing).
final class LoopWakeup: @unchecked Sendable {
    // Sendable: `fd` is written and read with system calls that are
    // thread-safe; `armed` is atomic.
    /// The eventfd, -1 when it could not be made (`run` then fails to start).
    let fd: Int32
    /// errno of a failed `eventfd`.
    let openError: Int32
    private let armed = Atomic<Bool>(false)

    init() {
        let f = CLibUV_eventfd()
        fd = f
        openError = f < 0 ? errno : 0
    }

    deinit {
        if fd >= 0 { close(fd) }
    }

    /// Any thread: makes the loop's poll callback run (once for any number
    /// of calls before it does).
    func wake() {
        guard fd >= 0, !armed.exchange(true, ordering: .sequentiallyConsistent) else { return }
        var one: UInt64 = 1
        // Cannot block (the counter would have to reach 2^64 − 1) nor fail
        // on a valid eventfd; EINTR is retried.
        while write(fd, &one, 8) < 0 && errno == EINTR {}
    }

    /// The loop, in its poll callback, before it takes what was posted.
    func consume() {
        var count: UInt64 = 0
        _ = read(fd, &count, 8)  // nonblocking: EAGAIN when another wake-up's read took it
        armed.store(false, ordering: .sequentiallyConsistent)
    }
}
