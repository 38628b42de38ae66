import ConcordCore
import ConcordJSON
import Synchronization

/// The core's worker threads: runs the independent items of one mutation
/// (views to rewrite, payloads to encode) in parallel, the calling thread
/// taking part, and returns when every item is done.
///
/// A hand-off across cores costs ~50 µs on this VM, so small jobs run inline:
/// parallelism pays only when there are many items — and only when another
/// core is free to take them. Whether it pays is measured, step by step
/// (``ParallelPolicy``): a machine whose cores the clients keep busy runs
/// the steps inline, and looks again now and then.
final class WorkerPool: ParallelExecutor, @unchecked Sendable {
    // Sendable: `job` and `generation` are only touched under `condition`;
    // the job's closure is only called while `forEach` waits for it; the
    // policy only on the calling thread (the sequencer's).
    let width: Int
    /// Below this many items a job runs on the caller alone.
    let inlineBelow: Int
    /// Whether spreading a step has paid lately (the caller's thread only).
    private(set) var policy = ParallelPolicy()

    private let condition = Condition()
    private let doneCondition = Condition()
    private var generation = 0
    private var job: Job?

    /// One call of `forEach`. Counters live in the job, so a worker that wakes
    /// late holding a finished job finds no index left and never calls its body.
    private final class Job {
        let count: Int
        let chunk: Int
        let body: (Int) -> Void
        let next = Atomic<Int>(0)
        let finished = Atomic<Int>(0)

        init(count: Int, chunk: Int, body: @escaping (Int) -> Void) {
            self.count = count
            self.chunk = chunk
            self.body = body
        }
    }

    init(threads: Int, inlineBelow: Int = 64) {
        width = max(1, threads)
        self.inlineBelow = inlineBelow
        for i in 1..<max(width, 1) {
            startThread(name: "concord-w\(i)") { [self] in self.workerLoop() }
        }
    }

    func forEach(_ count: Int, _ body: @escaping (Int) -> Void) {
        if width == 1 || count < inlineBelow || !policy.spreads() {
            for i in 0..<count { body(i) }
            return
        }
        do {
            let started = monotonicSeconds()
            let chunk = max(1, count / (width * 8))
            let j = Job(count: count, chunk: chunk, body: body)
            condition.withLock {
                job = j
                generation &+= 1
            }
            condition.broadcast()
            // The caller's pace is timed from here: waking the workers is the spread's cost, not the items'.
            let woke = monotonicSeconds()
            let mine = run(j)
            let ranOut = monotonicSeconds()
            doneCondition.lock()
            while j.finished.load(ordering: .acquiring) < count { doneCondition.wait() }
            doneCondition.unlock()
            condition.withLock { job = nil }
            policy.record(items: count, callerItems: mine, callerBusy: ranOut - woke, took: monotonicSeconds() - started)
        }
    }

    /// `stats`' `parallel`: the pool's threads and threshold, and what the
    /// policy did — steps spread, steps kept inline, spread steps that paid.
    var statsJSON: JSON? {
        ["threads": .int(width), "threshold": .int(inlineBelow), "spread": .int(policy.spread),
         "kept_inline": .int(policy.keptInline), "paid": .int(policy.paid)]
    }

    /// Runs chunks of `job` until none is left; returns how many items this thread ran.
    @discardableResult
    private func run(_ job: Job) -> Int {
        var ran = 0
        while true {
            let start = job.next.add(job.chunk, ordering: .relaxed).oldValue
            if start >= job.count { return ran }
            let end = min(start + job.chunk, job.count)
            ran += end - start
            for i in start..<end { job.body(i) }
            let done = job.finished.add(end - start, ordering: .acquiringAndReleasing).newValue
            if done == job.count {
                doneCondition.lock()
                doneCondition.signal()
                doneCondition.unlock()
            }
        }
    }

    private func workerLoop() {
        var seen = 0
        while true {
            condition.lock()
            while generation == seen || job == nil {
                if generation != seen && job == nil { seen = generation }
                condition.wait()
            }
            seen = generation
            let j = job!
            condition.unlock()
            run(j)
        }
    }
}

/// Whether spreading a step over the pool pays, from what the last spread
/// steps measured. A spread step is worth it when it ends sooner than the
/// caller alone would have: the caller's own pace (its busy time over the
/// items it ran) times the step's items is what inline would have taken.
/// It is not worth it when no other core is free — the clients, the loop
/// and the sequencer keep a small machine's cores busy — and a worker woken
/// late, or descheduled while holding a chunk, makes the caller wait: then
/// the step took longer than inline, and parallelism is a loss (measured on
/// 2 vCPUs: 100 model views per update, `--threads 2` gave 0.68–0.85× the
/// events/s of `--threads 1`).
///
/// After a step that did not pay (it saved under a tenth of its inline
/// estimate), the next `backoff` eligible steps run inline and the backoff
/// doubles, up to ``maxBackoff``; a step that paid resets it to none. So a
/// busy machine pays for one slow step in every 1,024 eligible ones, and a
/// machine with a free core spreads every step. The output never depends
/// on it: each item writes its own slot, whichever thread runs it.
struct ParallelPolicy {
    static let maxBackoff = 1024
    /// Eligible steps to run inline before spreading one again.
    private(set) var skip = 0
    /// The next skip after a step that did not pay.
    private(set) var backoff = 1
    /// Steps spread, steps run inline for the policy, and spread steps that paid.
    private(set) var spread = 0
    private(set) var keptInline = 0
    private(set) var paid = 0

    /// Whether the next eligible step is spread (counts it either way).
    mutating func spreads() -> Bool {
        if skip > 0 {
            skip -= 1
            keptInline += 1
            return false
        }
        spread += 1
        return true
    }

    /// What a spread step measured: its `items`, the `callerItems` the
    /// calling thread ran in `callerBusy` seconds, and its whole time `took`.
    mutating func record(items: Int, callerItems: Int, callerBusy: Double, took: Double) {
        // A caller that ran nothing (the workers took every chunk first) paid.
        if callerItems == 0 || took < callerBusy / Double(callerItems) * Double(items) * 0.9 {
            paid += 1
            backoff = 1
        } else {
            skip = backoff
            backoff = min(backoff * 2, Self.maxBackoff)
        }
    }
}
