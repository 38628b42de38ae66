import ConcordJSON
import Testing

@testable import ConcordServer

/// Whether the worker pool spreads a step is decided from what spread steps
/// measured (`ParallelPolicy`), never assumed: a step that did not end
/// sooner than the caller alone would have keeps the next ones inline, for
/// a backoff that doubles up to a bound; one that paid brings spreading
/// back at once. The measurements here are given, not timed.
struct ParallelPolicyTests {
    /// A spread step of 100 items where the caller ran `callerItems` at 1 µs
    /// each and the whole step took `took` µs.
    private func step(_ p: inout ParallelPolicy, callerItems: Int = 50, took: Double) {
        p.record(items: 100, callerItems: callerItems, callerBusy: Double(callerItems) * 1e-6, took: took * 1e-6)
    }

    /// Eligible steps until the policy spreads one again (each counted as kept inline).
    private func stepsKeptInline(_ p: inout ParallelPolicy) -> Int {
        var n = 0
        while !p.spreads() {
            n += 1
            if n > 10 * ParallelPolicy.maxBackoff { break }
        }
        return n
    }

    @Test func stepsThatPaySpreadEveryTime() {
        var p = ParallelPolicy()
        for _ in 0..<100 {
            let spreads = p.spreads()
            #expect(spreads)
            step(&p, took: 55)  // inline would have taken 100 µs
        }
        #expect(p.spread == 100 && p.paid == 100 && p.keptInline == 0)
    }

    @Test func stepsThatDoNotPayBackOffDoublingToTheBound() {
        var p = ParallelPolicy()
        var skips: [Int] = []
        for _ in 0..<14 {
            let spreads = p.spreads()
            #expect(spreads)
            step(&p, took: 140)  // the caller waited for a worker: slower than inline
            skips.append(stepsKeptInline(&p))
        }
        #expect(skips == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1024, 1024, 1024])
        #expect(p.paid == 0 && p.keptInline == skips.reduce(0, +))
    }

    @Test func aStepThatPaysEndsTheBackoff() {
        var p = ParallelPolicy()
        for _ in 0..<5 {
            _ = p.spreads()
            step(&p, took: 140)
            _ = stepsKeptInline(&p)
        }
        // Probing again: this one paid, so the next steps spread at once.
        step(&p, took: 60)
        let first = p.spreads(), second = p.spreads()
        #expect(first && second)
        // And a later slow one backs off from the start again.
        step(&p, took: 200)
        #expect(stepsKeptInline(&p) == 1)
    }

    @Test func aStepSavingUnderATenthDoesNotCountAsPaying() {
        var p = ParallelPolicy()
        _ = p.spreads()
        step(&p, took: 91)  // saved 9 %: the hand-off's risk is not worth that
        #expect(p.paid == 0)
        #expect(stepsKeptInline(&p) == 1)
        step(&p, took: 89)
        #expect(p.paid == 1)
        let spreads = p.spreads()
        #expect(spreads)
    }

    @Test func workersThatTookEveryChunkPaid() {
        var p = ParallelPolicy()
        _ = p.spreads()
        p.record(items: 100, callerItems: 0, callerBusy: 0, took: 1e-3)
        let spreads = p.spreads()
        #expect(p.paid == 1 && spreads)
    }

    /// The pool itself: a step of many items gives the same results spread or
    /// not, and `stats` shows the policy's counts.
    @Test func thePoolRunsEveryItemOnceAndShowsItsCounts() {
        let pool = WorkerPool(threads: 2, inlineBelow: 8)
        // Each item writes its own slot of memory the step owns (as the
        // render step's results do): no access to a shared array value.
        let hits = UnsafeMutableBufferPointer<Int>.allocate(capacity: 64)
        defer { hits.deallocate() }
        for _ in 0..<50 {
            hits.initialize(repeating: 0)
            pool.forEach(64) { i in hits[i] += 1 }
            #expect(Array(hits) == [Int](repeating: 1, count: 64))
        }
        pool.forEach(4) { _ in }  // below the threshold: inline, not counted
        let stats = pool.statsJSON
        func int(_ name: String) -> Int {
            guard case .number(let n)? = stats?[name], let i = n.intValue else { return -1 }
            return i
        }
        #expect(int("threads") == 2 && int("threshold") == 8)
        #expect(int("spread") + int("kept_inline") == 50 && int("spread") >= 1)
        #expect(int("paid") >= 0 && int("paid") <= int("spread"))
    }
}
