import ConcordCore
import ConcordJSON
import ConcordProtocol
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The core's own thread: takes what the loop read, runs it through the
/// ``Engine`` (which fans view work out to the worker pool), and hands the
/// resulting bytes back to the loop in one batch per turn.
///
/// One thread applies every request, so there is one total order of
/// mutations (`seq`) and every connection's output is produced in request
/// order: §6 holds by construction, whatever the number of workers.
///
/// Fairness and bounds: lines wait in one lane per connection; a turn takes
/// at most `linesPerTurn` lines from each lane, round-robin, so one client
/// that pipelines a million requests cannot hold a turn while others wait.
/// Bytes in the lanes are counted (per connection and in all) in atomics the
/// loop reads to stop reading a connection, or every connection, while the
/// core is behind: the inbox is bounded in bytes and nothing is ever dropped.
final class Sequencer: @unchecked Sendable {
    // Sendable: `inbox` is guarded by `condition`; `engine`, `lanes` and the
    // shutdown state are only touched by the sequencer thread once `start()`
    // has run; `inboxBytes` is atomic.
    enum Input {
        case open(ConnectionID, ConnectionFlow, PeerCredentials?)
        case close(ConnectionID)
        /// `readAt`: when the loop read them (``monotonicSeconds()``), for the latency histogram;
        /// `newcomer`: the loop's judgement (``isNewcomer(lines:idle:)``), counted in ``arrivals``.
        case frames(ConnectionID, [LineFramer.Frame], bytes: Int, readAt: Double, newcomer: Bool)
        /// A metrics scrape (`--metrics`): answered in ``Delivery/metrics`` with the same token.
        case metrics(token: Int)
        /// The loop wrote a coalescing connection's output down (§6.6).
        case drained(ConnectionID, episode: Int)
        /// A long line parsed by the ``BigLineParser`` (the head of the connection's lane).
        case parsed(ConnectionID, Engine.ParsedLine)
        case storage(StorageThread.Event)
        /// Cluster mode: entries read from the log, in log order.
        case clusterEntries([ClusterEntry])
        /// Cluster mode: what the link learned (attached, detached, head, failed appends).
        case cluster(ClusterLogEvent)
        /// Cluster mode, start-up: the newest snapshot, to load before reading the log after it.
        case loadSnapshot([UInt8])
        /// Cluster mode, after the log lost entries: its newest snapshot (nil: none) to rebuild from.
        case resyncSnapshot([UInt8]?)
        case shutdown
    }

    /// What the sequencer hands the loop after each turn.
    struct Delivery {
        var outputs: [(ConnectionID, [OutputChunk])]
        /// Everything read before the shutdown signal has been answered.
        var drained: Bool
        /// Lines were taken from the lanes: stalled connections may read again.
        var inputTaken: Bool
        /// When the mutations this delivery answers were read (at most
        /// ``ServerMetrics/latencySamplesPerTurn``): the loop records the time
        /// until it queued the writes as update → event latency.
        var mutationsReadAt: [Double] = []
        /// Prometheus text for scrapes, by token.
        var metrics: [(token: Int, text: [UInt8])] = []
        /// Cluster mode: mutations to append to the log (this turn's window), and whether a `sync` wants the log's head.
        var clusterAppends: [(ref: Int, line: [UInt8])] = []
        var clusterHeadWanted = false
        /// Cluster mode: the host caught up with the log (or stopped following it) for the first time: listen now.
        var clusterReady = false
        /// Cluster mode: the host stopped following the log; the link fetches the log's truth to rebuild from.
        var clusterResyncWanted = false
        /// A snapshot encoded for the link to upload.
        var clusterSnapshot: (offset: Int, streamID: String, bytes: [UInt8], sum: String)?
    }

    /// Bytes of lines read by the loop and not yet handed to the engine, all connections.
    let inboxBytes = Atomic<Int>(0)
    /// Bumped by the loop when it hands over a newcomer's lines (a ping
    /// beside a flood; ``isNewcomer(lines:idle:)``): a running turn looks at it
    /// every `arrivalCheckLines` lines and ends early, so that the newcomer
    /// is answered after that many of a flood's lines, not after the turn.
    let arrivals = Atomic<Int>(0)
    static let arrivalCheckLines = 16
    /// A turn that served a newcomer delivers once it is this old (at
    /// once, when it already is).
    static let newcomerTurn = 0.00025
    /// A newcomer: a few lines (a request, not a writer's window) from a
    /// connection whose previous lines came at least a millisecond ago (a
    /// pipelining writer's next read is not one). It is served before the
    /// lanes that keep the sequencer busy, and its answer delivered after
    /// that round; a writer that sends windows of many lines is not, so it
    /// does not cut other writers' turns into pieces (each piece a delivery).
    static func isNewcomer(lines: Int, idle: Double) -> Bool {
        lines <= 4 && idle >= 0.001
    }
    /// Cluster mode: log entries the loop read and the core has not applied (the reader pauses above a bound).
    let clusterQueued = Atomic<Int>(0)
    /// Cluster mode: entries read from the log, applied in order, a turn's budget at a time.
    private var logQueue: [ClusterEntry] = []
    private var logHead = 0
    private var loggedBroken = false
    private var readySent = false
    /// Cluster mode: entries between snapshots (and state digests); 0: none.
    private let snapshotEvery: Int
    /// A snapshot is being encoded (one at a time).
    private let snapshotting = Atomic<Bool>(false)
    /// Cluster mode with a local backend: the host's own copy of the state,
    /// stored at every snapshot point (on the snapshot thread) and at a clean stop.
    var clusterLocal: ClusterLocalCopy?

    private let condition = ParkingLock()
    private var inbox: [Input] = []
    private let engine: Engine
    private let pool: WorkerPool
    private let logger: Logger
    /// Where deliveries go, and lists come back from.
    private let bridge: Bridge
    /// Emptied lists for this thread's next turn, traded with the loop's at each delivery.
    private var spares = SpareLists()
    private let statsSource: ServerStatsSource
    let metrics: ServerMetrics
    /// Read times of the mutations applied since the last delivery (sampled).
    private var mutationsReadAt: [Double] = []
    private let linesPerTurn: Int
    private var bigLines: BigLineParser!
    private let turnBudget: Double
    private let shutdownTimeout: Double
    private var storage: StorageThread?

    /// One connection's lines, not yet handed to the engine.
    private final class Lane {
        let id: ConnectionID
        let flow: ConnectionFlow
        var frames: [LineFramer.Frame] = []
        /// When each frame was read, parallel to `frames`.
        var readAt: [Double] = []
        var head = 0
        /// The connection closed: close it in the engine once its lines are answered.
        var closeAfter = false
        /// The head line is long and being parsed off the sequencer; then its parse.
        var parsing = false
        var preparsed: Engine.ParsedLine?
        var queued: Bool { head < frames.count }
        /// The turn in which it last got a line, or began to wait for one.
        var servedInTurn = 0
        init(id: ConnectionID, flow: ConnectionFlow) {
            self.id = id
            self.flow = flow
        }
    }
    private var lanes = ConnectionMap<Lane>()
    /// Lanes that got lines while idle, since the last round: the next
    /// round takes them first, and the turn delivers after that round.
    private var newcomers: [Lane] = []
    /// The last round served newcomers first.
    private var newcomerRound = false
    /// Whether a round of the current turn already ran.
    private var handledInTurn = false
    /// Turns begun (wrapping); a lane's age is counted in them.
    private var turnNumber = 0
    /// A lane that got no line in this many turns goes first in the next
    /// turn's first round (``promoteStarved()``).
    static let starvedAfterTurns = 4
    /// Lanes with lines, in the order they got them (round-robin order).
    private var ready: [Lane] = []
    /// A turn's lists, kept between turns: emptied after each, their
    /// storage kept up to 4,096 entries (a burst does not pin memory).
    private struct TurnLists {
        var picked: [(lane: Lane, frames: ArraySlice<LineFramer.Frame>)] = []
        var lines: [ArraySlice<UInt8>] = []
        var parsed: [Engine.ParsedLine?] = []
        var stillReady: [Lane] = []

        mutating func empty() {
            picked.drain(keepingAtMost: 4096)
            lines.drain(keepingAtMost: 4096)
            parsed.drain(keepingAtMost: 4096)
            stillReady.drain(keepingAtMost: 4096)
        }
    }
    private var turnLists = TurnLists()
    private var shutdownDeadline: Double?
    private var drainedSent = false
    private var durability = Durability.async
    private var syncTimeout = 5.0
    /// Since when the backend fails to store (nil: it stores).
    private var failingSince: Double?
    private var failingMessage = ""
    /// Sync durability: deliveries wait until the backend stored every
    /// mutation they show (`tag` is the last seq applied when they were made).
    private var held: [(tag: Int, delivery: Delivery)] = []
    /// Mutations up to this seq were answered as not durable: what shows them is not held.
    private var releasedThrough = 0

    init(configuration: ServerConfiguration, logger: Logger, bridge: Bridge) {
        pool = WorkerPool(threads: configuration.threads, inlineBelow: configuration.parallelThreshold)
        engine = Engine(configuration: configuration.engine, executor: pool)
        metrics = ServerMetrics()
        statsSource = ServerStatsSource(metrics: metrics)
        statsSource.pool = pool
        engine.statsSource = statsSource
        engine.clock = { monotonicSeconds() }
        if let cluster = configuration.cluster { engine.enableCluster(cluster.settings) }
        snapshotEvery = configuration.cluster?.snapshotEvery ?? 0
        linesPerTurn = max(1, configuration.linesPerTurn)
        turnBudget = configuration.turnBudget
        shutdownTimeout = configuration.shutdownTimeout
        self.logger = logger
        self.bridge = bridge
        engine.collectsGarbage = true
        bigLines = BigLineParser(parser: engine.lineParser, idKey: engine.configuration.idKey) { [unowned self] id, parsed in self.submit(.parsed(id, parsed)) }
    }

    func submit(_ input: Input) {
        condition.lock()
        inbox.append(input)
        let wake = condition.takeSleeper()
        condition.unlock()
        if wake { condition.unpark() }
    }

    /// Attaches the cache backend (before `start`): write-behind, read-through.
    /// Reserves sequence numbers ahead first, so a restart after a crash never
    /// issues a number a client has already seen.
    func attach(backend: Backend, configuration: ServerConfiguration, logger: Logger) throws(BackendError) {
        let schema = StorageThread.readSchema(backend, idKey: engine.configuration.idKey, logger: logger)
        let start = StorageThread.readSeq(backend)
        let reserved = start + Engine.reservationBlock
        try StorageThread.writeReservation(backend, seq: start, upTo: reserved)
        durability = configuration.durability
        syncTimeout = configuration.syncTimeout
        engine.enablePersistence(durability: configuration.durability, schema: schema, lastSeq: start,
                                 reserved: reserved, maxUnstored: configuration.maxUnstoredRecords)
        engine.memoryLimit = configuration.memoryLimit
        engine.backendPersists = backend.stats()["persistent"] != false
        let s = StorageThread(backend: backend, idKey: engine.configuration.idKey, maxDepth: engine.configuration.maxDepth,
                              logger: logger, seq: start, reserved: reserved) { [self] event in
            self.submit(.storage(event))
        }
        storage = s
        statsSource.storage = s
        s.start()
    }

    /// Stores every queued write (retrying a failing backend up to the
    /// shutdown timeout) and closes the backend. Returns the records left unstored.
    func stopStorage() -> Int {
        storage?.stop(timeout: shutdownTimeout) ?? 0
    }

    /// Start-up failed after the backend was attached (the sequencer never
    /// ran): stop the storage thread and drop it, which also breaks the
    /// reference cycle through its event callback.
    func abandonStorage() {
        _ = storage?.stop(timeout: 0)
        storage = nil
        statsSource.storage = nil
    }

    func start() {
        startThread(name: "concord-seq") { [self] in self.run() }
    }

    private var hasRunnableLane: Bool {
        for lane in ready where lane.queued && !lane.parsing && !engine.isWaiting(lane.id) { return true }
        for lane in newcomers where lane.queued && !lane.parsing && !engine.isWaiting(lane.id) { return true }
        return false
    }

    private func run() {
        var batch: [Input] = []
        while true {
            condition.lock()
            while inbox.isEmpty && !hasRunnableLane && !engine.hasDeferredWork && logHead == logQueue.count {
                // Requests waiting for a `min_seq` (or for the cluster log) time out: look every 50 ms.
                if (shutdownDeadline != nil && !drainedSent) || (failingSince != nil && (engine.hasWaitingClients || !held.isEmpty))
                    || engine.hasSeqWaiters || engine.hasClusterWaits {
                    condition.park(seconds: 0.05)
                    break
                }
                condition.park()
            }
            swap(&batch, &inbox)
            condition.unlock()
            for input in batch { accept(input) }
            batch.drain()
            // Rounds of `linesPerTurn` lines per lane until the turn's time
            // budget is spent: one delivery per turn keeps hand-offs few, the
            // budget keeps a small request's wait short under a flood.
            var taken = false
            handledInTurn = false
            turnNumber &+= 1
            let started = monotonicSeconds()
            // The log first: what every host applies, in log order, within the turn's budget.
            if logHead < logQueue.count { applyLog(until: started + turnBudget) }
            var until = started + turnBudget
            while turn(until: until) {
                taken = true
                // A request that arrived while the turn ran (a ping beside a
                // flood) was just answered: the turn delivers soon, not after
                // the flood's rounds to the budget — but not sooner than
                // `newcomerTurn` after it began, so that a crowd of such
                // requests costs at most one delivery per that much time.
                if newcomerRound { until = min(until, started + Self.newcomerTurn) }
                if monotonicSeconds() >= until { break }
                condition.lock()
                swap(&batch, &inbox)
                condition.unlock()
                for input in batch { accept(input) }
                batch.drain()
            }
            // Deferred work (unfiling dropped query views) in slices: at least
            // one, more while this turn's budget lasts.
            if engine.hasDeferredWork {
                let until = max(started + turnBudget, monotonicSeconds() + turnBudget / 4)
                while engine.doDeferredWork(units: 2048) && monotonicSeconds() < until {}
            }
            // Large definitions of dropped views are freed on the parse thread.
            bigLines.discard(engine.takeGarbage())
            checkSyncTimeout()
            engine.expireSeqWaits()
            engine.expireClusterWaits()
            let drained = checkShutdown()
            if engine.memoryLimit > 0 {
                let n = engine.evictIfOverLimit(bytesInUse: AllocatorStats.allocatedBytes)
                if n > 0 { logger.debug("evicted records over the memory limit", metadata: ["concord.evicted": "\(n)"]) }
            }
            if let storage { storage.submit(engine.takeStorageItems()) }
            var outputs = spares.outputs.popLast() ?? []
            engine.takeOutput(into: &outputs, spares: &spares.chunks)
            let appends = engine.takeClusterAppends()
            let headWanted = engine.takeClusterHeadWanted()
            var ready = false
            if !readySent, let link = engine.clusterLink, link == .attached || link == .resyncing {
                readySent = true
                ready = true
            }
            let resync = engine.takeClusterResyncWanted()
            if !outputs.isEmpty || drained || taken || !appends.isEmpty || headWanted || ready || resync {
                var d = Delivery(outputs: outputs, drained: drained, inputTaken: taken)
                swap(&d.mutationsReadAt, &mutationsReadAt)
                if mutationsReadAt.capacity == 0, let s = spares.stamps.popLast() { mutationsReadAt = s }
                d.clusterAppends = appends
                d.clusterHeadWanted = headWanted
                d.clusterReady = ready
                d.clusterResyncWanted = resync
                send(d)
            } else {
                SpareLists.keep(&outputs, in: &spares.outputs)
                releaseHeld()
            }
        }
    }

    /// Async: hands the delivery over. Sync: events and responses wait until
    /// the backend stored what they show (in order: a later delivery never
    /// overtakes an earlier one).
    private func send(_ d: Delivery) {
        guard durability == .sync, storage != nil else { return bridge.post(d, exchanging: &spares) }
        let tag = engine.seq
        if held.isEmpty && tag <= max(engine.durableSeq, releasedThrough) { return bridge.post(d, exchanging: &spares) }
        held.append((tag, d))
        releaseHeld()
        // Connections stalled on input may read again even while output waits.
        if d.inputTaken && !held.isEmpty { bridge.post(Delivery(outputs: [], drained: false, inputTaken: true)) }
    }

    private func releaseHeld(force: Bool = false) {
        var n = 0
        let durable = max(engine.durableSeq, releasedThrough)
        while n < held.count, force || held[n].tag <= durable { n += 1 }
        guard n > 0 else { return }
        for (_, d) in held[..<n] { bridge.post(d) }
        held.removeFirst(n)
    }

    /// Sync: acknowledgements the failing backend could not confirm within
    /// `syncTimeout` are answered as applied but not durable, and what waited
    /// behind them goes out.
    private func checkSyncTimeout() {
        guard let since = failingSince, monotonicSeconds() - since >= syncTimeout else { return }
        guard engine.hasWaitingClients || !held.isEmpty else { return }
        engine.releaseNotDurable(reason: failingMessage)
        releasedThrough = engine.seq
        let outputs = engine.takeOutput()
        releaseHeld(force: true)
        if !outputs.isEmpty { bridge.post(Delivery(outputs: outputs, drained: false, inputTaken: false)) }
    }

    /// Control inputs act at once; lines join their connection's lane.
    private func accept(_ input: Input) {
        switch input {
        case .open(let id, let flow, let peer):
            lanes[id] = Lane(id: id, flow: flow)
            engine.open(id, flow: flow, peer: peer)
        case .close(let id):
            guard let lane = lanes[id] else { return }
            if lane.queued {
                lane.closeAfter = true
            } else {
                lanes[id] = nil
                engine.close(id)
            }
        case .frames(let id, let frames, _, let readAt, let newcomer):
            guard let lane = lanes[id] else { return }
            if !lane.queued {
                if newcomer { newcomers.append(lane) } else { ready.append(lane) }
                lane.servedInTurn = turnNumber
            }
            // An empty lane takes the read's list as it is (no copy of its
            // frames), and its own emptied list goes back to the loop for a read.
            if lane.frames.isEmpty {
                var emptied = frames
                swap(&emptied, &lane.frames)
                SpareLists.keep(&emptied, in: &spares.frames)
            } else {
                lane.frames.append(contentsOf: frames)
            }
            for _ in 0..<frames.count { lane.readAt.append(readAt) }
        case .metrics(let token):
            // Straight to the loop: a scrape never waits behind held (sync) output.
            let text = statsSource.exposition(engine.figures)
            bridge.post(Delivery(outputs: [], drained: false, inputTaken: false, metrics: [(token, text)]))
        case .drained(let id, let episode):
            engine.outputDrained(id, episode: episode)
        case .parsed(let id, let parsed):
            guard let lane = lanes[id] else { return }
            lane.parsing = false
            lane.preparsed = parsed
        case .storage(let event):
            switch event {
            case .committed(let seq, let reserved):
                engine.storageCommitted(through: seq, reserved: reserved)
                failingSince = nil
            case .failing(let message, let backlog):
                engine.storageFailing(message: message, backlog: backlog)
                if failingSince == nil { failingSince = monotonicSeconds() }
                failingMessage = message
            case .loaded(let result): engine.install(result)
            }
        case .clusterEntries(let entries):
            logQueue.append(contentsOf: entries)
        case .cluster(let event):
            engine.clusterEvent(event)
        case .resyncSnapshot(let bytes):
            // Entries read before the link went back to the log's truth are obsolete.
            clusterQueued.subtract(logQueue.count - logHead, ordering: .relaxed)
            logQueue.removeAll()
            logHead = 0
            loggedBroken = false
            do {
                let snap = try bytes.map { b throws(ClusterSnapshot.DecodeError) in try ClusterSnapshot.decode(b, maxDepth: engine.configuration.maxDepth) }
                try engine.beginClusterResync(from: snap)
                logger.warning("rebuilding from the cluster log", metadata: ["concord.snapshot_offset": "\(snap?.offset ?? 0)"])
            } catch {
                // A snapshot that does not decode, or a state the engine refuses (both describe themselves).
                logger.critical("cannot rebuild from the cluster log: \(error)")
            }
        case .loadSnapshot(let bytes):
            do {
                let snap = try ClusterSnapshot.decode(bytes, maxDepth: engine.configuration.maxDepth)
                try engine.loadClusterSnapshot(snap)
                logger.info("loaded the cluster snapshot", metadata: ["concord.offset": "\(snap.offset)", "concord.seq": "\(snap.seq)"])
            } catch {
                engine.clusterEvent(.broken(reason: "the cluster snapshot does not load: \(error)"))
            }
        case .shutdown:
            if shutdownDeadline == nil { shutdownDeadline = monotonicSeconds() + shutdownTimeout }
        }
    }

    /// Cluster mode: at every multiple of `snapshotEvery` the state is copied
    /// here (references: values are copy-on-write) and encoded on its own
    /// thread; the link publishes its checksum as this host's digest and
    /// uploads it when it gets the lease. One at a time: a point passed while
    /// one is encoding is skipped.
    private func takeSnapshot() {
        guard engine.clusterBroken == nil, !snapshotting.exchange(true, ordering: .relaxed) else { return }
        let snap = engine.clusterSnapshot()
        let bridge = self.bridge
        let logger = self.logger
        let local = clusterLocal
        startThread(name: "concord-snap") { [self] in
            let started = monotonicSeconds()
            let bytes = snap.encode()
            let sum = ClusterLink.fnvHex(bytes)
            var d = Delivery(outputs: [], drained: false, inputTaken: false)
            d.clusterSnapshot = (snap.offset, snap.streamID, bytes, sum)
            logger.debug("cluster snapshot encoded", metadata: [
                "concord.offset": "\(snap.offset)", "concord.bytes": "\(bytes.count)",
                "concord.ms": "\(Int((monotonicSeconds() - started) * 1000))",
            ])
            bridge.post(d)
            local?.store(snap, bytes: bytes, sum: sum)
            snapshotting.store(false, ordering: .relaxed)
        }
    }

    /// Applies log entries in order until the deadline (at least one).
    private func applyLog(until deadline: Double) {
        var n = 0
        while logHead < logQueue.count {
            if n > 0 && monotonicSeconds() >= deadline { break }
            let entry = logQueue[logHead]
            logHead += 1
            n += 1
            let before = engine.seq
            if !engine.applyClusterEntry(entry), !loggedBroken, let why = engine.clusterBroken {
                loggedBroken = true
                logger.critical("this host stopped following the cluster log", metadata: ["concord.reason": "\(why)"])
            }
            if engine.seq != before && mutationsReadAt.count < ServerMetrics.latencySamplesPerTurn { mutationsReadAt.append(monotonicSeconds()) }
            let offset = engine.clusterAppliedOffset
            if snapshotEvery > 0, offset == entry.offset, offset % snapshotEvery == 0 { takeSnapshot() }
        }
        clusterQueued.subtract(n, ordering: .relaxed)
        if logHead == logQueue.count {
            logQueue.removeAll(keepingCapacity: logQueue.count <= 1024)
            logHead = 0
        } else if logHead > 4096 {
            logQueue.removeFirst(logHead)
            logHead = 0
        }
    }

    static func frameBytes(_ f: LineFramer.Frame) -> Int {
        if case .line(let l) = f { return l.count + 1 }
        return 1
    }

    /// One round: takes a fair share of every runnable lane, parses it (a
    /// chunk ahead, in parallel when the chunk is long) and answers it in order. Returns
    /// true when lines were taken.
    private func turn(until deadline: Double = .infinity) -> Bool {
        // Newcomers first (round-robin order otherwise): whoever was idle
        // waits for no lane's lines but those handled before it arrived.
        // In the turn's first round everyone follows them; in a later round
        // (they came while the turn ran) the round is theirs alone — every
        // lane had a round this turn — and the turn then delivers (`run`).
        newcomerRound = !newcomers.isEmpty
        var lanesThisRound = ready.count
        if newcomerRound {
            ready.insert(contentsOf: newcomers, at: 0)
            lanesThisRound = handledInTurn ? newcomers.count : ready.count
            newcomers.drain()
        }
        if !handledInTurn { promoteStarved() }
        guard !ready.isEmpty else { return false }
        let arrivalsAtStart = arrivals.load(ordering: .relaxed)
        // The turn's lists are the sequencer's, emptied after each turn with
        // their storage kept: a turn of one request allocates none of them.
        var lists = turnLists
        turnLists = TurnLists()
        defer {
            lists.empty()
            turnLists = lists
        }
        var preparsed: [(index: Int, parsed: Engine.ParsedLine)] = []
        var preparsedLanes: [Int: Engine.ParsedLine] = [:]
        var bytesTaken = 0
        for lane in ready[..<lanesThisRound] where lane.queued {
            // Not starved while its head line is parsed elsewhere or it waits (a `min_seq`).
            guard !lane.parsing && !engine.isWaiting(lane.id) else {
                lane.servedInTurn = turnNumber
                continue
            }
            var end = min(lane.frames.count, lane.head + linesPerTurn)
            let headParsed = lane.preparsed
            if let p = headParsed {
                // The long head line, parsed: it alone this round.
                lane.preparsed = nil
                preparsed.append((lists.lines.count, p))
                preparsedLanes[lists.picked.count] = p
                end = lane.head + 1
            } else {
                // A long line is parsed off the sequencer: hand it over at the
                // head (the lane waits for it), or stop the slice before it.
                var handedOver = false
                for j in lane.head..<end {
                    guard case .line(let l) = lane.frames[j], l.count >= BigLineParser.threshold else { continue }
                    if j == lane.head {
                        lane.parsing = true
                        bigLines.submit(lane.id, l)
                        handedOver = true
                    } else {
                        end = j
                    }
                    break
                }
                if handedOver { continue }
            }
            let slice = lane.frames[lane.head..<end]
            lane.head = end
            var bytes = 0
            for f in slice {
                bytes += Self.frameBytes(f)
                // A parsed long line takes a place in `lines` but is not parsed again.
                if case .line(let l) = f { lists.lines.append(headParsed == nil ? l : []) }
            }
            lane.flow.unprocessed.subtract(bytes, ordering: .relaxed)
            bytesTaken += bytes
            lists.picked.append((lane, slice))
        }
        guard !lists.picked.isEmpty else { return false }
        let handledInTurnBefore = handledInTurn
        handledInTurn = true
        if newcomerRound { metrics.newcomerRounds.add(1, ordering: .relaxed) }
        inboxBytes.subtract(bytesTaken, ordering: .relaxed)

        // Lines are parsed a chunk ahead of the one handled, the chunk
        // doubling (1, 2, 4, …; in parallel once it is long): a turn that
        // runs out of time has parsed at most twice the lines it handled,
        // and parses the rest again next turn — not the whole round.
        // One by one: `append(contentsOf: repeatElement(nil, …))` went through
        // the generic path (~700 instructions for a turn of one line).
        lists.parsed.reserveCapacity(lists.lines.count)
        for _ in 0..<lists.lines.count { lists.parsed.append(nil) }
        for (i, p) in preparsed { lists.parsed[i] = p }
        var parsedEnd = 0
        var chunk = 1
        var next = 0
        var handled = 0
        var arrived = false
        var stopped: (lane: Int, frame: Int)?
        // The turn ends when its time is spent, not only after its lines: one
        // request that costs much (a big view, a mutation many live queries
        // see) cannot make the rest of the round wait behind it. At least one
        // line is handled per turn.
        outer: for (li, (lane, slice)) in lists.picked.enumerated() {
            for i in slice.indices {
                if handled > 0 && monotonicSeconds() >= deadline {
                    stopped = (li, i)
                    break outer
                }
                // Not before the round's last lane in the turn's first round:
                // that round serves every lane (twenty newcomers ahead of a
                // writer must not end it before the writer's turn comes).
                if !arrived && handled % Self.arrivalCheckLines == 0 && handled > 0
                    && (handledInTurnBefore || li == lists.picked.count - 1) {
                    arrived = arrivals.load(ordering: .relaxed) != arrivalsAtStart
                }
                // Someone idle sent a request: end the round where the lines
                // parsed ahead run out (the rest goes back unparsed: nothing
                // is parsed twice); the next round takes the newcomer first.
                // In a turn's first round the lane is not cut before its
                // first line: cut there whenever the parsed chunk ended just
                // before it, a pipelining writer behind newcomers that never
                // stop got no line in any turn (found under TSan, stop 41).
                if arrived && next >= parsedEnd && (handledInTurnBefore || i > slice.startIndex), case .line = slice[i] {
                    stopped = (li, i)
                    break outer
                }
                handled += 1
                lane.servedInTurn = turnNumber
                switch slice[i] {
                case .line:
                    if next >= parsedEnd { parseMore(lists.lines, &lists.parsed, end: &parsedEnd, chunk: &chunk) }
                    let before = engine.seq
                    if preparsed.isEmpty {
                        // Moved out, not copied: the request is freed when handled.
                        let line = lists.parsed[next].take()!
                        engine.handle(line, from: lane.id)
                    } else {
                        // A long line's parse is freed on its own thread (below).
                        engine.handle(lists.parsed[next]!, from: lane.id)
                    }
                    next += 1
                    if engine.seq != before && mutationsReadAt.count < ServerMetrics.latencySamplesPerTurn {
                        mutationsReadAt.append(lane.readAt[i])
                    }
                case .tooLarge:
                    engine.handleTooLarge(from: lane.id)
                }
            }
        }
        if let stopped { giveBack(lists.picked, from: stopped, preparsed: preparsedLanes) }
        // Long lines' trees are freed on the parser's thread, not in this turn.
        if !preparsed.isEmpty {
            for (i, _) in preparsed {
                if let p = lists.parsed[i] { bigLines.discard([p]) }
                lists.parsed[i] = nil
            }
            preparsed = []
            preparsedLanes = [:]
        }
        // Where the next turn starts (below), read before the picked slices
        // go: they share the lanes' frame lists, which are emptied next and
        // must then have no other holder to keep their storage.
        let stoppedLane = stopped.map { lists.picked[$0.lane].lane }
        let stoppedGotSome = stopped.map { $0.frame > lists.picked[$0.lane].frames.startIndex } ?? false
        lists.picked.drain(keepingAtMost: 4096)
        // Compact the lanes; a lane that emptied leaves the round-robin list
        // (and the connection, if it closed meanwhile).
        lists.stillReady.reserveCapacity(ready.count)
        for lane in ready {
            if lane.queued {
                if lane.head > 4096 && lane.head * 2 > lane.frames.count {
                    lane.frames.removeFirst(lane.head)
                    lane.readAt.removeFirst(lane.head)
                    lane.head = 0
                }
                lists.stillReady.append(lane)
            } else {
                lane.frames.drain(keepingAtMost: 1024)
                lane.readAt.drain(keepingAtMost: 1024)
                lane.head = 0
                if lane.closeAfter {
                    lanes[lane.id] = nil
                    engine.close(lane.id)
                }
            }
        }
        swap(&ready, &lists.stillReady)
        // Fairness across turns: the next one starts with the lane this one
        // stopped in when that lane got nothing, else with the one after it —
        // so a lane whose every line outlasts the budget gets one line per
        // turn and the others get theirs in between.
        if let stoppedLane, let at = ready.firstIndex(where: { $0 === stoppedLane }) {
            let first = stoppedGotSome ? (at + 1) % ready.count : at
            if first > 0 { ready = Array(ready[first...] + ready[..<first]) }
        }
        return true
    }

    /// Lanes that got no line in ``starvedAfterTurns`` turns move to the
    /// front, the longest-waiting first, ahead of the newcomers. Newcomers
    /// go first for latency, and a turn ends when its budget is spent; when
    /// newcomers alone fill every turn's budget (requests that each cost
    /// more than the budget over their number, or a slow machine), the
    /// lanes behind them — a pipelining writer, and newcomers of an earlier
    /// turn pushed back by later ones — got nothing for ever (found under
    /// ThreadSanitizer: a writer with no answer in 60 s, and requests with
    /// none in 10 s). With this each waits at most a few turns.
    private func promoteStarved() {
        let now = turnNumber
        guard ready.count > 1, ready.contains(where: { now &- $0.servedInTurn >= Self.starvedAfterTurns }) else { return }
        var starved: [Lane] = [], rest: [Lane] = []
        for lane in ready {
            if now &- lane.servedInTurn >= Self.starvedAfterTurns { starved.append(lane) } else { rest.append(lane) }
        }
        starved.sort { now &- $0.servedInTurn > now &- $1.servedInTurn }
        ready = starved + rest
    }

    /// Parses the next chunk of the turn's lines (a chunk ahead of the one
    /// handled, the chunk doubling: 1, 2, 4, …; on the pool once it is long).
    private func parseMore(_ lines: [ArraySlice<UInt8>], _ parsed: inout [Engine.ParsedLine?], end parsedEnd: inout Int, chunk: inout Int) {
        let range = parsedEnd..<min(lines.count, parsedEnd + chunk)
        parsedEnd = range.upperBound
        if chunk < 4096 { chunk *= 2 }
        let parser = engine.lineParser
        if range.count >= pool.inlineBelow {
            parsed.withUnsafeMutableBufferPointer { out in
                let out = out
                pool.forEach(range.count) { k in
                    let i = range.lowerBound + k
                    if out[i] == nil { out[i] = Engine.parse(lines[i], parser: parser) }
                }
            }
        } else {
            for i in range where parsed[i] == nil { parsed[i] = Engine.parse(lines[i], parser: parser) }
        }
    }

    /// Lines a turn took but did not handle (its time ran out) go back to
    /// their lanes, and their bytes back to the counters; those already
    /// parsed (at most as many as were handled) are parsed again next turn.
    private func giveBack(_ picked: [(lane: Lane, frames: ArraySlice<LineFramer.Frame>)], from stop: (lane: Int, frame: Int),
                          preparsed: [Int: Engine.ParsedLine]) {
        var back = 0
        for li in stop.lane..<picked.count {
            let (lane, slice) = picked[li]
            let from = li == stop.lane ? stop.frame : slice.startIndex
            var bytes = 0
            for f in slice[from...] { bytes += Self.frameBytes(f) }
            lane.head = from
            // A long line parsed off the sequencer keeps its parse.
            if from == slice.startIndex, let p = preparsed[li] { lane.preparsed = p }
            lane.flow.unprocessed.add(bytes, ordering: .relaxed)
            back += bytes
        }
        inboxBytes.add(back, ordering: .relaxed)
    }

    /// True once, when everything read before the shutdown signal was answered
    /// (or the shutdown timeout passed, when whatever waits is answered anyway).
    private func checkShutdown() -> Bool {
        guard let deadline = shutdownDeadline, !drainedSent else { return false }
        let idle = !ready.contains { $0.queued } && !newcomers.contains { $0.queued } && !engine.hasWaitingClients && held.isEmpty && !engine.hasClusterWaits
        if !idle {
            guard monotonicSeconds() >= deadline else { return false }
            logger.warning("shutdown timeout: answering what still waits without it", metadata: [
                "concord.waiting_clients": "\(engine.waitingClientCount)",
            ])
            engine.isShuttingDown = true
            engine.abandonWaits(reason: failingSince != nil ? failingMessage : "the server is shutting down")
            engine.expireClusterWaits()
            while turn() {}
            let outputs = engine.takeOutput()
            releaseHeld(force: true)
            if !outputs.isEmpty { bridge.post(Delivery(outputs: outputs, drained: false, inputTaken: false)) }
        }
        engine.isShuttingDown = true
        drainedSent = true
        storeLocalCopyAtStop()
        let c = engine.counts
        logger.info("core drained", metadata: [
            "concord.seq": "\(engine.seq)", "concord.entities": "\(c.entities)",
            "concord.documents": "\(c.documents)",
        ])
        return true
    }

    /// A clean stop in cluster mode with a local backend: the state as of the
    /// last entry applied goes to the local copy (after a snapshot thread
    /// still storing, if any), so that a restart reads only what followed.
    private func storeLocalCopyAtStop() {
        guard let local = clusterLocal, engine.clusterBroken == nil, engine.clusterAppliedOffset > 0 else { return }
        let deadline = monotonicSeconds() + 60
        while snapshotting.exchange(true, ordering: .relaxed) {
            guard monotonicSeconds() < deadline else { return }
            usleep(10_000)
        }
        let snap = engine.clusterSnapshot()
        let bytes = snap.encode()
        local.store(snap, bytes: bytes, sum: ClusterLink.fnvHex(bytes))
        snapshotting.store(false, ordering: .relaxed)
    }
}
