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
    /// consumer waiting with posts it has not seen.
    @Test func noWakeUpIsLostWhenPostsRaceTheConsumer() async {
        let w = LoopWakeup()
        let posted = Count()
        let producers = 4, each = 20_000
        let total = producers * each
        let consumer = Task.detached { () -> (seen: Int, stuck: Bool) in
            var seen = 0
            while seen < total {
                // 5 s without a wake-up while posts are outstanding: one was lost.
                guard Self.readable(w, within: 5000) else { return (seen, true) }
                w.consume()
                seen = posted.value.load(ordering: .sequentiallyConsistent)
            }
            return (seen, false)
        }
        await withTaskGroup(of: Void.self) { g in
            for _ in 0..<producers {
                g.addTask {
                    for _ in 0..<each {
                        posted.value.add(1, ordering: .sequentiallyConsistent)
                        w.wake()
                    }
                }
            }
        }
        let r = await consumer.value
        #expect(!r.stuck, "the consumer saw \(r.seen) of \(total) posts and no wake-up came")
        #expect(r.seen == total)
    }
}
