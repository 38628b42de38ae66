import ConcordCore
import ConcordProtocol
import Logging

/// The core's own thread: takes what the loop read, in arrival order, runs
/// it through the ``Engine`` (which fans view work out to the worker pool),
/// and hands the resulting bytes back to the loop in one batch per wake-up.
///
/// One thread applies every request, so there is one total order of
/// mutations (`seq`) and every connection's output is produced in request
/// order: §6 holds by construction, whatever the number of workers.
final class Sequencer: @unchecked Sendable {
    // Sendable: `inbox` is guarded by `condition`; `engine` is only touched
    // by the sequencer thread once `start()` has run.
    enum Input {
        case open(ConnectionID)
        case close(ConnectionID)
        case frames(ConnectionID, [LineFramer.Frame])
        case storage(StorageThread.Event)
        case shutdown
    }

    /// What the sequencer hands the loop after each batch.
    struct Delivery {
        var outputs: [(ConnectionID, [OutputChunk])]
        var drained: Bool
    }

    private let condition = Condition()
    private var inbox: [Input] = []
    private let engine: Engine
    private let pool: WorkerPool
    private let logger: Logger
    private let deliver: @Sendable (Delivery) -> Void
    private let statsSource: ServerStatsSource
    private var storage: StorageThread?

    init(configuration: ServerConfiguration, logger: Logger, deliver: @escaping @Sendable (Delivery) -> Void) {
        pool = WorkerPool(threads: configuration.threads, inlineBelow: configuration.parallelThreshold)
        engine = Engine(configuration: configuration.engine, executor: pool)
        statsSource = ServerStatsSource()
        engine.statsSource = statsSource
        self.logger = logger
        self.deliver = deliver
    }

    func submit(_ input: Input) {
        condition.lock()
        inbox.append(input)
        let wasEmpty = inbox.count == 1
        condition.unlock()
        if wasEmpty { condition.signal() }
    }

    /// Attaches the cache backend (before `start`): write-behind, read-through.
    func attach(backend: Backend, durability: Durability, memoryLimit: Int, logger: Logger) {
        let schema = StorageThread.readSchema(backend, idKey: engine.configuration.idKey, logger: logger)
        engine.enablePersistence(durability: durability, schema: schema, lastSeq: StorageThread.readSeq(backend))
        engine.memoryLimit = memoryLimit
        let s = StorageThread(backend: backend, idKey: engine.configuration.idKey, logger: logger) { [self] event in
            self.submit(.storage(event))
        }
        storage = s
        statsSource.storage = s
        s.start()
    }

    /// Flushes every queued write and closes the backend (at shutdown, after the drain).
    func stopStorage() {
        storage?.stop()
    }

    func start() {
        startThread(name: "concord-seq") { [self] in self.run() }
    }

    private func run() {
        var batch: [Input] = []
        while true {
            condition.lock()
            while inbox.isEmpty { condition.wait() }
            swap(&batch, &inbox)
            condition.unlock()
            let drained = process(batch)
            batch.removeAll(keepingCapacity: true)
            if engine.memoryLimit > 0 {
                let n = engine.evictIfOverLimit(bytesInUse: AllocatorStats.allocatedBytes)
                if n > 0 { logger.debug("evicted records over the memory limit", metadata: ["concord.evicted": "\(n)"]) }
            }
            if let storage { storage.submit(engine.takeStorageItems()) }
            let outputs = engine.takeOutput()
            if !outputs.isEmpty || drained {
                deliver(Delivery(outputs: outputs, drained: drained))
            }
        }
    }

    /// Runs one batch; true when it held the shutdown marker.
    private func process(_ batch: [Input]) -> Bool {
        // Parse every line of the batch first, in parallel when there are many.
        var lines: [[UInt8]] = []
        for input in batch {
            if case .frames(_, let frames) = input {
                for f in frames { if case .line(let l) = f { lines.append(l) } }
            }
        }
        var parsed = [Engine.ParsedLine?](repeating: nil, count: lines.count)
        if lines.count >= pool.inlineBelow {
            let parser = engine.lineParser
            parsed.withUnsafeMutableBufferPointer { out in
                let out = out
                let lines = lines
                pool.forEach(lines.count) { i in out[i] = Engine.parse(lines[i], parser: parser) }
            }
        } else {
            for i in lines.indices { parsed[i] = Engine.parse(lines[i], parser: engine.lineParser) }
        }

        var next = 0
        var drained = false
        for input in batch {
            switch input {
            case .open(let id):
                engine.open(id)
            case .close(let id):
                engine.close(id)
            case .frames(let id, let frames):
                for f in frames {
                    switch f {
                    case .line:
                        engine.handle(parsed[next]!, from: id)
                        next += 1
                    case .tooLarge:
                        engine.handleTooLarge(from: id)
                    }
                }
            case .storage(let event):
                switch event {
                case .committed(let seq): engine.storageCommitted(through: seq)
                case .failed(let seq, let message): engine.storageFailed(through: seq, message: message)
                case .loaded(let result): engine.install(result)
                }
            case .shutdown:
                engine.isShuttingDown = true
                drained = true
                let c = engine.counts
                logger.info("core drained", metadata: [
                    "concord.seq": "\(engine.seq)", "concord.entities": "\(c.entities)",
                    "concord.documents": "\(c.documents)",
                ])
            }
        }
        return drained
    }
}
