import Foundation
import Synchronization
import Testing

@testable import ConcordServer

#if canImport(Glibc)
import Glibc
#endif

/// The sequencer's wake-ups of the loop (``LoopWakeup``): coalesced while
/// armed, armed again once consumed, and never lost when posts race the
/// loop's consume.
struct LoopWakeupTests {
    final class Count: Sendable {
        let value = Atomic<Int>(0)
    }

    /// Whether the eventfd is readable within `ms` milliseconds.
    static func readable(_ w: LoopWakeup, within ms: Int32) -> Bool {
        var p = pollfd(fd: w.fd, events: Int16(POLLIN), revents: 0)
        return poll(&p, 1, ms) == 1 && p.revents & Int16(POLLIN) != 0
    }

    @Test func wakeUpsCoalesceUntilTheLoopConsumesThem() {
        let w = LoopWakeup()
        #expect(w.fd >= 0)
        #expect(!Self.readable(w, within: 0))
        w.wake()
        w.wake()
        w.wake()
        // One write for the three: the counter reads 1.
        var count: UInt64 = 0
        #expect(read(w.fd, &count, 8) == 8)
        #expect(count == 1)
        // Still armed (not consumed): another wake writes nothing.
        w.wake()
        #expect(!Self.readable(w, within: 0))
        w.consume()
        w.wake()
        #expect(Self.readable(w, within: 0))
        w.consume()
        #expect(!Self.readable(w, within: 0))
    }

    /// Producers post (count, then wake) while a consumer polls, consumes
    /// and reads the count, as the loop does: a lost wake-up leaves the
    /// consumer waiting with posts it has not seen. Threads of their own,
    /// not tasks: the consumer blocks in `poll`, and blocking the shared
    /// task pool (which the suite's other tests use at the same time) kept
    /// the producers from running under a sanitizer.
    @Test func noWakeUpIsLostWhenPostsRaceTheConsumer() {
        let w = LoopWakeup()
        let posted = Count()
        let producers = 4, each = 20_000
        let total = producers * each
        final class Result: @unchecked Sendable {
            // Written by the consumer thread before it signals `done`.
            var seen = 0
            var stuck = false
        }
        let result = Result()
        let done = DispatchSemaphore(value: 0)
        Thread {
            while result.seen < total {
                // 60 s without a wake-up while posts are outstanding: one was lost.
                guard Self.readable(w, within: 60_000) else {
                    result.stuck = true
                    break
                }
                w.consume()
                result.seen = posted.value.load(ordering: .sequentiallyConsistent)
            }
            done.signal()
        }.start()
        let finished = DispatchSemaphore(value: 0)
        for _ in 0..<producers {
            Thread {
                for _ in 0..<each {
                    posted.value.add(1, ordering: .sequentiallyConsistent)
                    w.wake()
                }
                finished.signal()
            }.start()
        }
        for _ in 0..<producers { finished.wait() }
        done.wait()
        #expect(!result.stuck, "the consumer saw \(result.seen) of \(total) posts and no wake-up came")
        #expect(result.seen == total)
    }
}
