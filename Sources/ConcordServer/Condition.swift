import CConcordRuntime

#if canImport(Glibc)
import Glibc
#endif

/// A pthread mutex with one condition variable, heap-allocated so it never moves.
final class Condition: @unchecked Sendable {
    // Sendable: the pthread objects are designed for cross-thread use.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let cond = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    init() {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(cond, nil)
    }

    deinit {
        pthread_cond_destroy(cond)
        pthread_mutex_destroy(mutex)
        cond.deallocate()
        mutex.deallocate()
    }

    func lock() { pthread_mutex_lock(mutex) }
    func unlock() { pthread_mutex_unlock(mutex) }
    /// Waits for a signal; call with the lock held.
    func wait() { pthread_cond_wait(cond, mutex) }
    /// Waits for a signal or until `seconds` have passed; call with the lock held.
    func wait(seconds: Double) {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let ns = Int(now.tv_nsec) + Int(seconds * 1e9)
        var deadline = timespec(tv_sec: now.tv_sec + ns / 1_000_000_000, tv_nsec: ns % 1_000_000_000)
        _ = pthread_cond_timedwait(cond, mutex, &deadline)
    }
    func signal() { pthread_cond_signal(cond) }
    func broadcast() { pthread_cond_broadcast(cond) }

    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }
}

/// A pthread mutex and a sleep on a futex word, for one thread that sleeps
/// when it has nothing to do and is woken by the others (the sequencer).
/// A condition variable made a system call that woke nobody after every
/// wake-up: glibc's `pthread_cond_wait` takes the mutex back marked
/// contended, so the sleeper's next unlock called the kernel. Here the
/// sleeper releases the mutex before it sleeps and takes it back
/// uncontended, and a waker calls the kernel only when the owner sleeps.
final class ParkingLock: @unchecked Sendable {
    // Sendable: the mutex guards `sleeping`; the word is only touched
    // atomically (CConcordRuntime).
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    private var sleeping = false

    init() {
        pthread_mutex_init(mutex, nil)
        word.initialize(to: 0)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
        word.deallocate()
    }

    func lock() { pthread_mutex_lock(mutex) }
    func unlock() { pthread_mutex_unlock(mutex) }

    /// Sleeps until ``unpark()`` (or `seconds`, or a spurious wake-up: the
    /// caller looks again). Call with the lock held; returns with it held.
    func park(seconds: Double? = nil) {
        let epoch = concord_park_word(word)
        sleeping = true
        unlock()
        concord_park(word, epoch, seconds.map { Int64($0 * 1e9) } ?? -1)
        lock()
        sleeping = false
    }

    /// Whether the owner sleeps or is going to (then ``unpark()`` after
    /// unlocking): call with the lock held.
    func takeSleeper() -> Bool {
        guard sleeping else { return false }
        sleeping = false
        return true
    }

    /// Wakes the owner (an unpark before it sleeps keeps it awake).
    func unpark() { concord_unpark(word) }
}

/// Starts a detached pthread running `body`.
func startThread(name: String, _ body: @escaping @Sendable () -> Void) {
    final class Box: @unchecked Sendable {
        // Sendable: handed to exactly one new thread, which consumes it.
        let body: @Sendable () -> Void
        let name: String
        init(_ body: @escaping @Sendable () -> Void, _ name: String) {
            self.body = body
            self.name = name
        }
    }
    let box = Unmanaged.passRetained(Box(body, name)).toOpaque()
    var tid = pthread_t()
    // Model trees are walked recursively (to --max-depth levels): give every
    // core thread a generous stack rather than the platform default.
    let attr = UnsafeMutablePointer<pthread_attr_t>.allocate(capacity: 1)
    pthread_attr_init(attr)
    pthread_attr_setstacksize(attr, 64 << 20)
    defer {
        pthread_attr_destroy(attr)
        attr.deallocate()
    }
    let rc = pthread_create(&tid, attr, { arg in
        let box = Unmanaged<AnyObject>.fromOpaque(arg!).takeRetainedValue() as! Box
        // Named for `top -H`, perf and gdb (Linux keeps 15 bytes).
        concord_set_thread_name(String(box.name.utf8.prefix(15))!)
        box.body()
        return nil
    }, box)
    precondition(rc == 0, "pthread_create failed: \(rc)")
    pthread_detach(tid)
}

/// Seconds on a clock that never goes back (for deadlines and backoff).
func monotonicSeconds() -> Double {
    var t = timespec()
    clock_gettime(CLOCK_MONOTONIC, &t)
    return Double(t.tv_sec) + Double(t.tv_nsec) / 1e9
}
