import ConcordCore
import Synchronization

/// The core's worker threads: runs the independent items of one mutation
/// (views to rewrite, payloads to encode) in parallel, the calling thread
/// taking part, and returns when every item is done.
///
/// A hand-off across cores costs ~50 µs on this VM, so small jobs run inline:
/// parallelism pays only when there are many items.
final class WorkerPool: ParallelExecutor, @unchecked Sendable {
    // Sendable: `job` and `generation` are only touched under `condition`;
    // the job's closure is only called while `forEach` waits for it.
    let width: Int
    /// Below this many items a job runs on the caller alone.
    let inlineBelow: Int

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
        if width == 1 || count < inlineBelow {
            for i in 0..<count { body(i) }
            return
        }
        do {
            let chunk = max(1, count / (width * 8))
            let j = Job(count: count, chunk: chunk, body: body)
            condition.withLock {
                job = j
                generation &+= 1
            }
            condition.broadcast()
            run(j)
            doneCondition.lock()
            while j.finished.load(ordering: .acquiring) < count { doneCondition.wait() }
            doneCondition.unlock()
            condition.withLock { job = nil }
        }
    }

    private func run(_ job: Job) {
        while true {
            let start = job.next.add(job.chunk, ordering: .relaxed).oldValue
            if start >= job.count { return }
            let end = min(start + job.chunk, job.count)
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
