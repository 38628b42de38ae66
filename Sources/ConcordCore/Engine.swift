import Synchronization
public import ConcordJSON
public import ConcordProtocol

/// A connection's number, chosen by the driver.
public typealias ConnectionID = Int

/// Settings of the consistency core. Every member has the documented default.
public struct EngineConfiguration: Sendable {
    /// The identity member of entities (`--id-key`). Default `"id"`.
    public var idKey = "id"
    /// Maximum nesting of a request line; the request object is level 1. Default 128.
    public var maxDepth = 128
    /// Maximum line length without its newline. Default 16 MiB.
    public var maxLineBytes = 16 << 20
    /// Live subscriptions per connection. Default 65536.
    public var maxSubscriptionsPerConnection = 65536
    /// Live subscriptions on all connections together (`--max-subscriptions`);
    /// one more gets `limit_exceeded`. Bounds their memory whatever the number
    /// of connections: ~160–250 bytes each plus what their views hold.
    /// Default 2,000,000.
    public var maxSubscriptions = 2_000_000
    /// Live query views (distinct definitions) in all; a subscription or `get`
    /// that would build one more gets `limit_exceeded`. Default 100,000.
    public var maxQueryViews = 100_000
    /// Entities all query views may hold together (each view holds every
    /// entity it matches, not only its window) when a new view is built;
    /// past it the new view is refused with `limit_exceeded`. Default 4,000,000
    /// (about 2 GB at today's ~570 bytes per member).
    public var maxQueryEntities = 4_000_000
    /// Unsent output of a connection (bytes handed to the driver and not yet
    /// written, plus bytes queued in the core) above which its subscriptions
    /// coalesce instead of queueing every event (PROTOCOL.md §6.6). 0: never.
    /// Default 1 MiB.
    public var outputSoftBytes = 1 << 20
    /// Check every index against the records after each mutation
    /// (Engine+Invariants.swift). Default: `CONCORD_INTERNAL_CHECKS` set.
    public var internalChecks = Engine.internalChecksFromEnvironment
    /// Reported by `hello`.
    /// Mutations the change history keeps (feed replay, §3.2), tombstones
    /// and the shortest token retention, in mutations.
    public var historyMutations = 100_000
    /// Entity changes the history holds in all (its memory bound): past it
    /// the oldest mutations leave early.
    public var historyEntities = 1_000_000
    /// Tokens are remembered at least this long, in seconds (and for the
    /// last `historyMutations` mutations), within `tokenBytes`.
    public var tokenRetention = 3600.0
    /// Memory for remembered tokens (≈ token length + 64 B each): past it
    /// the oldest are forgotten early.
    public var tokenBytes = 64 << 20
    public var serverName = "concord-server"
    public var version = "0.1.0"

    public init() {}
}

/// Figures the driver adds to `stats` (allocator, cache backend).
public protocol EngineStatsSource: AnyObject {
    func memoryStats() -> JSON
    func cacheStats() -> JSON
    /// The metrics in Prometheus's text format (`stats` with `"prometheus":true`).
    func prometheusText(_ figures: EngineFigures) -> String
}

/// The core's counters and gauges at one moment (its own thread), for metrics.
public struct EngineFigures: Sendable {
    /// Requests answered, by op (``Operation/metricNames``); lines that are
    /// not a valid request count only under `errors`.
    public var requests: [(op: String, count: Int)]
    /// Error answers by code (``ErrorCode/all``).
    public var errors: [(code: String, count: Int)]
    /// Responses queued (one per request line).
    public var responses: Int
    /// Events queued: every line the core wrote that is not a response.
    public var events: Int
    public var coalescedEvents: Int
    public var coalescingEpisodes: Int
    public var connections: Int
    public var connectionsCoalescing: Int
    /// Output handed to the driver that the sockets have not taken yet.
    public var unsentBytes: Int
    /// Live subscriptions by kind (``Engine/subscriptionKindNames``).
    public var subscriptions: [(kind: String, count: Int)]
    public var entities: Int
    public var documents: Int
    public var collections: Int
    public var seq: Int
}

/// A request's `model` as bytes of its own line that are exactly what
/// ``JSONWriter`` writes for it (``JSONParser/parse(_:verbatimMember:)``).
public struct VerbatimModel: Sendable {
    /// The line (a slice of the array its read's lines share: `LineFramer`).
    public let line: ArraySlice<UInt8>
    /// Offsets from the line's first byte.
    public let range: Range<Int>
}

/// The consistency core: a deterministic state machine.
///
/// The driver feeds it lines and connection events in one total order; it
/// answers by appending bytes to each connection's ``OutputQueue``. All its
/// state is owned by the thread that calls it. The only parallelism is
/// inside one mutation: views are rewritten and events encoded through the
/// ``ParallelExecutor``, each work item touching its own view only, and the
/// results are assembled in a fixed order afterwards — so output does not
/// depend on the number of threads.
public final class Engine {
    public let configuration: EngineConfiguration
    let executor: any ParallelExecutor
    /// The request being processed: its `model`'s bytes and the members
    /// they were parsed into, while its events are written (`writeStored`).
    var verbatimModel: (VerbatimModel, members: [JSONObject.Member])?
    /// The members the store gave the model's root entity instead, with the
    /// same bytes (`Store.sharedRoot`): they splice as well.
    var verbatimShared: [JSONObject.Member]?
    /// The request being processed, when it came decoded (``ParsedLine``).
    var prepared: PreparedRequest?
    /// With `collectsGarbage` (the server sets it): what is large to free —
    /// a dropped view's 100,000-value definition and sets — kept for the
    /// caller to free on another thread (``takeGarbage()``) instead of in a turn.
    public var collectsGarbage = false
    var garbage: [any Sendable] = []
    /// How many values were written from request bytes instead of encoded (tests read it).
    let splicedValues = Atomic<Int>(0)
    public weak var statsSource: (any EngineStatsSource)?

    let store: Store
    var tree: Tree { store.tree }
    let parser: JSONParser
    /// The render map step's slots, reused by every mutation (Render+Map.swift).
    let renderResults = RenderResults(count: 0)
    /// The writer buffer of a mutation with one render job (Render+Map), kept between mutations.
    var renderBuffer: [UInt8] = []
    /// The payload of a mutation with one render job, when it is short
    /// enough that every queue copies it (`OutputQueue.copyLimit`): nothing
    /// holds it once the job's events are queued, and the next such
    /// mutation writes into it again instead of allocating (Render+Map).
    var smallPayload = OutputBytes.block(capacity: OutputQueue.copyLimit)
    /// A fan-out's shared event (`SharedEvent`), written over by the next.
    let sharedEventScratch = ByteScratch(capacity: OutputQueue.copyLimit + 64)
    /// A mutation's op list (a single op's) and effects, kept between
    /// mutations empty with their capacity: two allocations fewer each.
    var opsScratch: [(Mutation, origin: String?)] = []
    var effectsScratch: [ViewEffect] = []
    /// The identities a mutation's updates wrote, in order (for the version
    /// table), kept between mutations empty with their capacity. Collected
    /// as the effects are made: reading them back out of the effects copied
    /// each effect, its entity map and values (~300 instructions an update).
    var writtenScratch: [String] = []
    /// The render plan's job list, kept (empty) between mutations.
    var jobsScratch: [RenderPlan.Job] = []

    var clients = ConnectionMap<ClientSession>()
    var dirtyClients: [ClientSession] = []
    /// Connections whose queued bytes went past `outputSoftBytes` when they
    /// were last marked dirty: what `checkCongestion` looks at (not every
    /// dirty connection, which would make a turn of fan-out quadratic).
    var congested: [ClientSession] = []
    /// Closed connections whose subscriptions are still being ended, a
    /// slice at a time between turns (deferred work): `closingHead` is next.
    var closingClients: [ClientSession?] = []
    /// Connections whose head request waits for a `min_seq`.
    var seqWaiters: [ClientSession] = []
    var closingHead = 0

    /// Identity → the model views holding it.
    var modelWatchers: [String: [ObjectIdentifier: ModelView]] = [:]
    /// Root identity → the model views a new subscription with an equal
    /// tree joins (at most `Engine.modelSharesPerRoot` each: a subscribe
    /// compares its tree with those only, so its cost stays bounded however
    /// many different trees share a root; a view not listed is simply not
    /// shared).
    var modelShares: [String: [ModelView]] = [:]
    /// The next model view's `serial`.
    var modelViewSerial = 0
    /// Numbers render plans, so a plan lists each model view once (`ModelView.planMark`).
    var modelPlanMark = 0
    var keyViews = NameTable<KeySubscribers>()
    var collectionViews = NameTable<CollectionView>()
    /// Identity → the `ids` subscriptions listing it.
    var idWatchers: [String: EntityWatchers] = [:]
    /// `feed` subscriptions, kept in event order between changes like an entity's watchers.
    var feeds = EntityWatchers()
    var subscriptionCount = 0
    /// Live query views and their indexes (Engine+Queries.swift).
    let queries: QueryRegistry
    /// Coalescing (§6.6): the last episode number handed out, episodes begun, coalesced events written.
    var nextCoalescingEpisode = 0
    var coalescingEpisodes = 0
    var coalescedEvents = 0
    /// Figures for the driver's metrics (``figures``): requests by
    /// ``Operation/metricIndex``, error answers by code, responses and lines
    /// handed to the driver (every line is a response or an event), live
    /// subscriptions by kind (``SubscriptionKindName``).
    var requestsByOp = [Int](repeating: 0, count: Operation.metricNames.count)
    var errorsByCode: [ErrorCode: Int] = [:]
    var responsesQueued = 0
    var linesTaken = 0
    var subscriptionsByKind = [Int](repeating: 0, count: Engine.subscriptionKindNames.count)

    /// Write-behind and read-through state; nil without a cache backend.
    var persistence: PersistenceState?
    /// The backend keeps records across restarts (`stats.cache.persistent`):
    /// it may then hold entities memory has never seen.
    public var backendPersists = true
    /// Bytes (as the driver measures them) above which unreferenced records
    /// are evicted from memory; 0: no limit. Needs a cache backend.
    public var memoryLimit = 0

    /// The number of the last applied mutation.
    public internal(set) var seq = 0
    /// Cluster mode (PROTOCOL §8, Engine+Cluster.swift); nil on a single server.
    var cluster: ClusterState?
    /// Last changes, history and tokens (PROTOCOL §3.2, §4.1).
    /// Made in `init`, not lazily: a lazy property's getter checked and
    /// copied its optional on every access (~45 instructions an update).
    var versions: Versions
    /// Once set, every request is answered `shutting_down`.
    public var isShuttingDown = false
    /// Seconds on a monotonic clock, for connection ages (`stats` with
    /// `clients`). The driver sets it; the core itself never reads time.
    public var clock: @Sendable () -> Double = { 0 }

    public init(configuration: EngineConfiguration = EngineConfiguration(), executor: any ParallelExecutor = InlineExecutor()) {
        self.configuration = configuration
        self.executor = executor
        self.store = Store(idKey: configuration.idKey)
        self.queries = QueryRegistry(identities: store.entities)
        self.parser = JSONParser(maxDepth: configuration.maxDepth)
        self.versions = Versions(historyMutations: configuration.historyMutations, historyEntityLimit: configuration.historyEntities,
                                 tokenRetention: configuration.tokenRetention, tokenByteLimit: configuration.tokenBytes)
        // Values refreshed in place are reconstructed when asked for (Store.reconstructedBefore):
        // with the internal checks, against a copy kept of each.
        if configuration.internalChecks { store.beforeCheck = ([:], [:]) }
    }

    deinit {
        // Collection views and their subscriptions hold each other; unregistering
        // breaks the links, so a discarded engine frees everything.
        for id in Array(clients.keys) { close(id) }
        while hasDeferredWork { doDeferredWork(units: 1 << 20) }
    }

    // MARK: Connections

    /// A new connection. `flow` is shared with the driver (see ``ConnectionFlow``);
    /// `peer`: the process at the other end, when the driver knows it.
    public func open(_ id: ConnectionID, flow: ConnectionFlow = ConnectionFlow(), peer: PeerCredentials? = nil) {
        let c = ClientSession(id: id, flow: flow)
        c.peer = peer
        c.openedAt = clock()
        clients[id] = c
    }

    /// Ends every subscription of the connection; nothing of it stays
    /// behind. The connection is gone at once (nothing more is written to
    /// it); its subscriptions are ended as deferred work, a slice between
    /// turns, so closing a connection with very many never holds a turn.
    public func close(_ id: ConnectionID) {
        guard let c = clients.removeValue(forKey: id) else { return }
        c.closed = true
        c.closing = c.subs.values
        c.output = OutputQueue()
        closingClients.append(c)
        checkInvariantsIfEnabled()
    }

    /// Work the engine put off so that no turn holds it: ending the
    /// subscriptions of closed connections, and unfiling dropped query views
    /// from the indexes. The driver calls ``doDeferredWork(units:)`` between
    /// turns while this is true; nothing a client sees depends on it
    /// (a closed connection's output is discarded, dropped views are
    /// already invisible).
    public var hasDeferredWork: Bool { closingHead < closingClients.count || hasRetiringViews }

    /// Does at most about `units` steps of deferred work (a step: one
    /// membership or one index entry, well under a microsecond; ending a
    /// subscription counts 8, plus the entities of a model view). Returns
    /// whether some remains.
    @discardableResult
    public func doDeferredWork(units: Int = 4096) -> Bool {
        var used = endClosedSubscriptions(units: max(1, units))
        if used < units { used += unfileRetiredViews(units: units - used) }
        if used < units { used += releaseHandles(units: units - used) }
        checkInvariantsIfEnabled()
        return hasDeferredWork
    }

    /// Ends subscriptions of closed connections, oldest connection first.
    private func endClosedSubscriptions(units: Int) -> Int {
        var used = 0
        while used < units, closingHead < closingClients.count {
            guard let c = closingClients[closingHead] else { closingHead += 1; continue }
            while used < units, let s = c.closing.popLast() {
                // Ended meanwhile (an entity cap, `clear`): already unregistered.
                guard c.subs[s.name] === s else { continue }
                if case .model(let view) = s.kind, view.only === s { used += view.ids.count }
                unregister(s)
                _ = c.subs.removeValue(forKey: s.name)
                used += 8
            }
            guard c.closing.isEmpty else { break }
            c.subs.removeAll()
            c.pauses.removeAll()
            closingClients[closingHead] = nil  // released
            closingHead += 1
        }
        if closingHead == closingClients.count {
            closingClients.removeAll()
            closingHead = 0
        }
        return used
    }

    public var connectionCount: Int { clients.count }

    /// Output queued since the last call, per connection, in the order it must be written.
    public func takeOutput() -> [(ConnectionID, [OutputChunk])] {
        var out: [(ConnectionID, [OutputChunk])] = []
        var spares: [[OutputChunk]] = []
        takeOutput(into: &out, spares: &spares)
        return out
    }

    /// `takeOutput()` appended to `out`, each connection's chunks in a list
    /// taken from `spares` (emptied lists with room, handed back by whoever
    /// wrote the last ones: a turn of one request then allocates no list).
    /// A list found empty goes back to `spares`.
    public func takeOutput(into out: inout [(ConnectionID, [OutputChunk])], spares: inout [[OutputChunk]]) {
        out.reserveCapacity(out.count + dirtyClients.count)
        for c in dirtyClients {
            c.dirty = false
            // Closed: events rendered for its subscriptions before they ended go nowhere.
            if c.closed { c.output = OutputQueue(); continue }
            let bytes = c.output.byteCount
            linesTaken += c.output.lineCount
            var segs = spares.popLast() ?? []
            c.output.take(into: &segs)
            guard !segs.isEmpty else {
                if segs.capacity > 0 { spares.append(segs) }
                continue
            }
            out.append((c.id, segs))
            let unsent = c.flow.unsent.add(bytes, ordering: .relaxed).newValue
            c.unsentBound = unsent
            if c.coalescing == 0, configuration.outputSoftBytes > 0, unsent > configuration.outputSoftBytes, clients[c.id] === c {
                beginCoalescing(c)
            }
        }
        dirtyClients.drain()
    }

    /// Bytes queued for a connection and not yet taken.
    public func queuedBytes(_ id: ConnectionID) -> Int { clients[id]?.output.byteCount ?? 0 }

    // MARK: Input

    /// A line the framer found too long.
    public func handleTooLarge(from id: ConnectionID) {
        // Through `handle`, so it waits its turn behind a parked request.
        handle(.failure(ProtocolError(.tooLarge, "line longer than \(configuration.maxLineBytes) bytes; skipped up to its newline")), from: id)
    }

    /// Parses and answers one request line.
    public func handleLine(_ line: [UInt8], from id: ConnectionID) {
        handle(Self.parse(line, parser: parser), from: id)
    }

    /// A line parsed (possibly on another thread) by ``parse(_:parser:)``.
    public enum ParsedLine: Sendable {
        /// `model`: where the request's `model` lies in its line, when those
        /// bytes are exactly its encoding (``VerbatimModel``).
        case value(JSON, model: VerbatimModel? = nil)
        /// A long line decoded with its parse, off the sequencer, its query
        /// prepared (the engine does not decode it again). One reference, so
        /// that the common case above is passed around no larger.
        case prepared(PreparedRequest)
        /// An `update` read from its line's bytes (``UpdateLine``: the
        /// common write, without the request object's tree); `line` keeps
        /// the bytes its model may be sent as.
        case update(UpdateLine, line: ArraySlice<UInt8>)
        case failure(ProtocolError)

        /// The request, when it came decoded (a long line).
        var decoded: Request? {
            switch self {
            case .prepared(let p): return p.request
            case .update(let u, _): return u.request
            default: return nil
            }
        }

        /// The line's JSON, when it parsed.
        var json: JSON? {
            switch self {
            case .value(let v, _): return v
            case .prepared(let p): return p.value
            case .update(let u, _): return u.json
            case .failure: return nil
            }
        }
    }

    /// Parses a request line. With `decodeWith` (the engine's `idKey`; the
    /// parse thread of long lines), a line that decodes as a request comes
    /// with it decoded and its query prepared, so that the sequencer neither
    /// decodes it nor encodes or hashes its query; one that does not is left
    /// for the engine to decode, which answers its error.
    public static func parse(_ line: [UInt8], parser: JSONParser, decodeWith idKey: String? = nil) -> ParsedLine {
        parse(line[...], parser: parser, decodeWith: idKey)
    }

    /// ``parse(_:parser:decodeWith:)`` of a line the framer found (a slice
    /// of its read's shared array).
    public static func parse(_ line: ArraySlice<UInt8>, parser: JSONParser, decodeWith idKey: String? = nil) -> ParsedLine {
        if let u = line.withUnsafeBufferPointer({ UpdateLine.read($0, parser: parser) }) { return .update(u, line: line) }
        do {
            let (value, range) = try line.withUnsafeBufferPointer { (b) throws(JSONParseError) in try parser.parse(b, verbatimMember: "model") }
            let model = range.map { VerbatimModel(line: line, range: $0) }
            if let idKey, let request = try? Request.decode(value, idKey: idKey) {
                return .prepared(PreparedRequest(request, value: value, model: model))
            }
            return .value(value, model: model)
        } catch {
            switch error.kind {
            case .tooDeep: return .failure(ProtocolError(.tooDeep, "\(error.reason) at byte \(error.offset)"))
            case .syntax: return .failure(ProtocolError(.parseError, "invalid JSON: \(error.reason) at byte \(error.offset)"))
            }
        }
    }

    public var lineParser: JSONParser { parser }

    /// What was kept to be freed elsewhere (`collectsGarbage`); empty after.
    public func takeGarbage() -> [any Sendable] {
        guard !garbage.isEmpty else { return [] }
        defer { garbage = [] }
        return garbage
    }

    /// The query of the request being processed, prepared: as it came with
    /// the request (a long line), or prepared now.
    func preparedQuery(_ spec: QuerySpec) -> PreparedQuery {
        if let p = prepared?.query, p.spec.type == spec.type, p.spec.offset == spec.offset, p.spec.limit == spec.limit { return p }
        return PreparedQuery(spec)
    }

    /// The request's `model` as its line's bytes and the members they were
    /// parsed into, when those bytes are exactly its encoding: its events
    /// splice them (``verbatimModel``). Assigned in each case (an optional
    /// tuple returned and assigned cost ~230 instructions more an update).
    @inline(__always)
    func beginVerbatim(_ parsed: ParsedLine) {
        switch parsed {
        case .value(let v, let model?):
            if case .object(let r) = v, case .object(let m)? = r["model"] { verbatimModel = (model, m.members) }
        case .prepared(let p):
            if let model = p.model, case .object(let r) = p.value, case .object(let m)? = r["model"] { verbatimModel = (model, m.members) }
        case .update(let u, let line):
            beginVerbatim(u, line)
        default:
            break
        }
    }

    /// `beginVerbatim` of an update read from `line`.
    func beginVerbatim(_ u: UpdateLine, _ line: ArraySlice<UInt8>) {
        if let range = u.modelRange, case .object(let m) = u.model { verbatimModel = (VerbatimModel(line: line, range: range), m.members) }
    }

    /// The request's model is no longer the one being written.
    func endVerbatim() {
        verbatimModel = nil
        if verbatimShared != nil { verbatimShared = nil }
    }

    // Owned: the line is destroyed here, in its own module, where the
    // enum's layout is known; the sequencer destroying it after the call
    // went through the runtime's generic value witnesses (~190
    // instructions an update).
    public func handle(_ parsed: __owned ParsedLine, from id: ConnectionID) {
        guard let c = clients[id] else { return }
        if c.isWaiting {
            // Cluster mode: a mutation behind the connection's own mutations
            // in the log goes to the log too (answers stay in order: the log
            // applies one host's appends in order).
            if c.onlyLogPending, let cl = cluster, appendBehindPending(parsed, c, cl) { return }
            c.backlog.append(parsed)
            return
        }
        let before = seq
        process(consume parsed, c)
        if seq != before && !seqWaiters.isEmpty { wakeSeqWaiters() }
    }

    func process(_ parsed: __owned ParsedLine, _ c: ClientSession) {
        c.requests += 1
        // Events held back before this request are written before its response (§6.6).
        if !c.coalesced.isEmpty { flushCoalesced(c) }
        // An update on a single server without a backend: nothing below but
        // the shutdown check and `dispatch` applies to it (no log, no
        // `min_seq`, no keys to read first, no use to note), so it goes to
        // `mutate` from its line's own mutation and options — no `Request`
        // built, copied apart and destroyed (~640 instructions an update).
        // `processUpdate` repeats those steps: a step added below for all
        // requests must be added there too.
        // Its parts moved out of the line, not copied.
        if cluster == nil, persistence == nil, case .update = parsed {
            guard case .update(let u, let line) = consume parsed else { return }
            processUpdate(u, line, c)
            return
        }
        var value: JSON
        let request: Request
        switch parsed {
        case .failure(let e):
            respondError(c, rid: .null, e)
            return
        case .value(let v, _):
            do {
                request = try Request.decode(v, idKey: configuration.idKey)
            } catch {
                var rid = JSON.null
                if case .object(let o) = v, let r = Request.rid(of: o) { rid = r }
                respondError(c, rid: rid, error)
                return
            }
            value = v
        case .prepared(let p):
            request = p.request
            value = p.value
            prepared = p
        case .update(let u, _):
            request = u.request
            // The request object is built only for the cluster log's append.
            value = .null
        }
        beginVerbatim(parsed)
        defer {
            endVerbatim()
            if prepared != nil { prepared = nil }
        }
        if isShuttingDown {
            respondError(c, rid: request.rid, ProtocolError(.shuttingDown, "the server is shutting down"))
            return
        }
        let rerun = c.rerunAfterSync
        c.rerunAfterSync = false
        if let cl = cluster {
            if goesThroughLog(request) {
                if case .update(let u, _) = parsed { value = u.json }
                do {
                    try appendToLog(request, value, c, cl)
                } catch {
                    respondError(c, rid: request.rid, error)
                }
                return
            }
            // `sync`, and a `since` this host has not reached (it may be the cluster's): wait for the log's head (§8.3, §8.9).
            if case .sync = request.op {
                parkForSync(c, parsed, rid: request.rid, timeoutMs: request.timeoutMs, rerun: false, cl)
                return
            }
            if !rerun, case .subscribe = request.op, let n = request.since, n > seq {
                parkForSync(c, parsed, rid: request.rid, timeoutMs: request.timeoutMs, rerun: true, cl)
                return
            }
        }
        // `min_seq` past what is applied: answered once it is (§8.3).
        if let m = request.minSeq, m > seq {
            let timeout = Double(request.timeoutMs ?? 5000) / 1000
            parkForSeq(c, parsed, rid: request.rid, minSeq: m, deadline: clock() + timeout)
            return
        }
        if persistence != nil {
            let keys = missingKeys(request.op)
            if !keys.isEmpty {
                park(c, parsed, keys: keys)
                return
            }
        }
        noteUse(request.op)
        requestsByOp[request.op.metricIndex] += 1
        do {
            try dispatch(request, c)
        } catch {
            respondError(c, rid: request.rid, error)
        }
        checkInvariantsIfEnabled()
    }

    /// `process` of an update read from its bytes, on a single server
    /// without a backend: the same steps as the general path.
    private func processUpdate(_ u: UpdateLine, _ line: ArraySlice<UInt8>, _ c: ClientSession) {
        beginVerbatim(u, line)
        defer { endVerbatim() }
        if isShuttingDown {
            respondError(c, rid: u.rid, ProtocolError(.shuttingDown, "the server is shutting down"))
            return
        }
        c.rerunAfterSync = false
        requestsByOp[Self.updateMetricIndex] += 1
        do {
            // Most updates give no option: the shared empty options are
            // lent to `mutate`, not made, copied and destroyed (~200 instructions).
            if u.hasOptions {
                try mutate(c, rid: u.rid, u.mutation, u.options)
            } else {
                try mutate(c, rid: u.rid, u.mutation, Self.noOptions)
            }
        } catch {
            respondError(c, rid: u.rid, error)
        }
        checkInvariantsIfEnabled()
    }

    private static let noOptions = MutationOptions()

    private static let updateMetricIndex = Operation.mutation(.update(model: .null, key: nil, mode: .replace, force: false), MutationOptions()).metricIndex

    func dispatch(_ r: Request, _ c: ClientSession, fromLog: Bool = false) throws(ProtocolError) {
        switch r.op {
        case .hello(let name):
            if let name { c.name = name }
            respond(c, rid: r.rid) { w in
                w.key("server"); w.string(configuration.serverName)
                w.key("version"); w.string(configuration.version)
                w.key("protocol"); w.int(1)
                w.key("id_key"); w.string(configuration.idKey)
                w.key("limits"); w.raw("{\"max_depth\":"); w.int(configuration.maxDepth)
                w.raw(",\"max_line_bytes\":"); w.int(configuration.maxLineBytes)
                w.raw(",\"max_subscriptions\":"); w.int(configuration.maxSubscriptionsPerConnection)
                w.raw(",\"max_subscriptions_total\":"); w.int(configuration.maxSubscriptions)
                w.raw(",\"history\":"); w.int(configuration.historyMutations)
                w.raw("}")
                if let cl = cluster {
                    w.key("cluster"); w.raw("{\"name\":"); w.string(cl.settings.name)
                    w.raw(",\"host\":"); w.string(cl.settings.host); w.raw("}")
                }
            }
        case .ping, .sync:
            // On a single server every accepted mutation is applied: `sync` answers at once.
            respond(c, rid: r.rid) { w in
                w.key("seq"); w.int(seq)
                if let cl = cluster { writeClusterStatus(&w, cl) }
            }
        case .stats(let listClients, let prometheus):
            respondStats(c, rid: r.rid, clients: listClients, prometheus: prometheus)
        case .get(let target):
            switch target {
            case .key(let k):
                let v = store.document(k) ?? .null
                respond(c, rid: r.rid) { w in w.key("model"); w.value(v); w.key("seq"); w.int(seq) }
            case .id(let id):
                let v = store.entity(id) ?? .null
                respond(c, rid: r.rid) { w in w.key("model"); w.value(v); w.key("seq"); w.int(seq) }
            case .collection(let name):
                let items = store.collectionItems(name)
                respond(c, rid: r.rid) { w in w.key("items"); w.value(.array(items)); w.key("seq"); w.int(seq) }
            case .query(let spec):
                let (items, count) = try readQuery(preparedQuery(spec))
                respond(c, rid: r.rid) { w in
                    w.key("items"); w.value(.array(items))
                    w.key("count"); w.int(count)
                    w.key("seq"); w.int(seq)
                }
            }
        case .schema(let lists):
            if let lists {
                store.setSchema(lists)
                recordSchemaWrite()
            }
            respond(c, rid: r.rid) { w in
                w.key("required")
                RecordCodec.writeSchema(&w, store.requiredLists)
            }
        case .subscribe(let name, let target):
            if let n = r.since, n > seq {
                throw ProtocolError(.badRequest, "since \(n) is after the last applied seq \(seq)")
            }
            try subscribe(c, rid: r.rid, name: name, target: target, since: r.since)
        case .unsubscribe(let name):
            guard let s = c.subs.removeValue(forKey: name) else { throw noSuchSub(name) }
            unregister(s)
            respond(c, rid: r.rid) { _ in }
        case .pause(let name):
            guard let s = c.subs[name] else { throw noSuchSub(name) }
            pause(s)
            respond(c, rid: r.rid) { _ in }
        case .resume(let name):
            guard let s = c.subs[name] else { throw noSuchSub(name) }
            resume(s)
            respond(c, rid: r.rid) { _ in }
        case .mutation(let m, let options):
            try mutate(c, rid: r.rid, m, options, fromLog: fromLog)
        }
    }

    func noSuchSub(_ name: String) -> ProtocolError {
        ProtocolError(.noSuchSub, "no live subscription named '\(clipID(name))' on this connection")
    }

    // MARK: Responses

    /// After bytes were queued for `c` (every append is followed by this).
    func markDirty(_ c: ClientSession) {
        if !c.dirty {
            c.dirty = true
            dirtyClients.append(c)
        }
        // Queued bytes only grow here and at `takeOutput` (which checks on
        // its own), so this sees every connection that passes the soft limit.
        // The bound rules out most connections without reading the shared
        // counter (written by the event loop: reading it on every event of
        // a fan-out moved its cache line between the cores); when it does
        // not, the counter decides.
        let soft = configuration.outputSoftBytes
        if soft > 0, !c.congested, c.coalescing == 0, c.output.byteCount + c.unsentBound > soft {
            c.unsentBound = c.flow.unsent.load(ordering: .relaxed)
            if c.output.byteCount + c.unsentBound > soft {
                c.congested = true
                congested.append(c)
            }
        }
    }

    /// A mutation's answer, `"seq":N` (rid-less ones without a writer).
    func respond(_ c: ClientSession, rid: JSON, seq: Int) {
        guard case .null = rid else {
            respond(c, rid: rid) { w in w.key("seq"); w.int(seq) }
            return
        }
        if !c.coalesced.isEmpty { flushCoalesced(c) }
        c.output.appendResponse(seq: seq)
        responsesQueued += 1
        markDirty(c)
    }

    func respond(_ c: ClientSession, rid: JSON, _ body: (inout JSONWriter) -> Void) {
        // A response follows every event it must follow; coalesced ones too (§6.6).
        if !c.coalesced.isEmpty { flushCoalesced(c) }
        // Straight into the connection's own output buffer: no temporary array.
        c.output.write { w in
            w.raw("{\"rid\":")
            w.value(rid)
            w.raw(",\"ok\":true")
            body(&w)
            w.raw("}\n")
        }
        responsesQueued += 1
        markDirty(c)
    }

    func respondError(_ c: ClientSession, rid: JSON, _ e: ProtocolError) {
        if !c.coalesced.isEmpty { flushCoalesced(c) }
        responsesQueued += 1
        errorsByCode[e.code, default: 0] += 1
        var w = JSONWriter(capacity: 96)
        w.raw("{\"rid\":")
        w.value(rid)
        w.raw(",\"ok\":false,\"error\":{\"code\":")
        w.string(e.code.rawValue)
        w.raw(",\"message\":")
        w.string(e.message)
        for (k, v) in e.details {
            w.raw(",")
            w.string(k)
            w.raw(":")
            w.value(v)
        }
        w.raw("}}\n")
        c.output.append(w.bytes)
        markDirty(c)
    }

    func respondStats(_ c: ClientSession, rid: JSON, clients listClients: Bool = false, prometheus: Bool = false) {
        let memory = statsSource?.memoryStats() ?? .object(JSONObject())
        let cache = statsSource?.cacheStats() ?? ["backend": "memory", "entities": .int(store.entities.count)]
        // Written first: it reads every connection's queue, the asker's included.
        var list: [UInt8] = []
        if listClients {
            var lw = JSONWriter(capacity: 128 * clients.count)
            writeClients(&lw)
            list = lw.bytes
        }
        // Read before writing into the asker's own queue (the figures read every queue).
        let figures = self.figures
        let prometheusText = prometheus ? statsSource?.prometheusText(figures) ?? "" : ""
        respond(c, rid: rid) { w in
            w.key("connections"); w.int(clients.count)
            w.key("subscriptions"); w.int(subscriptionCount)
            w.key("entities"); w.int(store.entities.count)
            w.key("documents"); w.int(store.documents.count)
            w.key("collections"); w.int(store.collections.count)
            w.key("seq"); w.int(seq)
            w.key("requests"); w.int(requestsByOp.reduce(0, +))
            w.key("events"); w.int(figures.events)
            w.key("coalescing"); w.int(clients.values.reduce(0) { $0 + ($1.coalescing != 0 ? 1 : 0) })
            w.key("coalescing_episodes"); w.int(coalescingEpisodes)
            w.key("coalesced_events"); w.int(coalescedEvents)
            // Live queries: distinct lists of matches (pages of one list share
            // one), definitions (what --max-query-views bounds), member slots
            // they hold (what --max-query-entities bounds), and dropped views
            // still being unfiled.
            w.key("queries"); w.raw("{\"views\":"); w.int(queries.views.count)
            w.raw(",\"definitions\":"); w.int(queries.windows.count)
            w.raw(",\"held\":"); w.int(queries.heldMembers)
            w.raw(",\"unfiling\":"); w.int(queries.retiring.count - queries.retiringHead)
            w.raw("}")
            // Change history (feed replay) and remembered tokens (§3.2, §4.1):
            // what they hold and about how many bytes (bounded by
            // --history-mutations/--history-entities and --token-memory).
            w.key("history"); w.raw("{\"mutations\":"); w.int(versions.historyMutationsHeld)
            w.raw(",\"entities\":"); w.int(versions.historyEntities)
            w.raw(",\"reaches_back_to\":"); w.int(versions.historyFloor)
            w.raw(",\"names\":"); w.int(versions.namesHeld)
            w.raw(",\"tokens\":"); w.int(versions.tokens.count)
            w.raw(",\"bytes\":"); w.int(versions.approximateBytes)
            w.raw("}")
            w.key("memory"); w.value(memory)
            w.key("cache"); w.value(cache)
            if let p = executor.statsJSON { w.key("parallel"); w.value(p) }
            if let cl = cluster { writeClusterStatus(&w, cl) }
            if listClients { w.raw(list) }
            if prometheus { w.key("prometheus"); w.string(prometheusText) }
        }
    }

    /// Names of the subscription kinds, in `subscriptionsByKind` order.
    public static let subscriptionKindNames = ["model", "key", "collection", "ids", "feed", "query"]

    /// Counters and gauges for the driver's metrics, read on the core's thread.
    public var figures: EngineFigures {
        var connectionsCoalescing = 0
        var unsent = 0
        for c in clients.values {
            if c.coalescing != 0 { connectionsCoalescing += 1 }
            unsent += c.flow.unsent.load(ordering: .relaxed)
        }
        // Lines queued and not yet handed over count too: the figures read
        // the same whether asked before or after `takeOutput`.
        var pendingLines = 0
        for c in dirtyClients { pendingLines += c.output.lineCount }
        let lines = linesTaken + pendingLines
        return EngineFigures(
            requests: zip(Operation.metricNames, requestsByOp).map { ($0, $1) },
            errors: ErrorCode.all.map { ($0.rawValue, errorsByCode[$0] ?? 0) },
            responses: responsesQueued,
            events: max(0, lines - responsesQueued),
            coalescedEvents: coalescedEvents,
            coalescingEpisodes: coalescingEpisodes,
            connections: clients.count,
            connectionsCoalescing: connectionsCoalescing,
            unsentBytes: unsent,
            subscriptions: zip(Self.subscriptionKindNames, subscriptionsByKind).map { ($0, $1) },
            entities: store.entities.count,
            documents: store.documents.count,
            collections: store.collections.count,
            seq: seq)
    }

    /// `"clients":[…]`, one object per connection in connection order: who it
    /// is (name from `hello`, peer pid/uid/gid), how old, how busy, and how far
    /// behind (bytes the socket has not taken, lines not yet processed).
    func writeClients(_ w: inout JSONWriter) {
        let now = clock()
        w.key("clients")
        w.raw("[")
        for (i, id) in clients.keys.sorted().enumerated() {
            guard let c = clients[id] else { continue }
            if i > 0 { w.raw(",") }
            w.raw("{\"id\":"); w.int(id)
            w.raw(",\"name\":"); if let n = c.name { w.string(n) } else { w.raw("null") }
            if let p = c.peer {
                w.raw(",\"pid\":"); w.int(Int(p.pid))
                w.raw(",\"uid\":"); w.int(Int(p.uid))
                w.raw(",\"gid\":"); w.int(Int(p.gid))
            }
            w.raw(",\"age_ms\":"); w.int(Int((now - c.openedAt) * 1000))
            w.raw(",\"subscriptions\":"); w.int(c.subs.count)
            w.raw(",\"requests\":"); w.int(c.requests)
            w.raw(",\"unsent_bytes\":"); w.int(c.flow.unsent.load(ordering: .relaxed) + c.output.byteCount)
            w.raw(",\"unprocessed_bytes\":"); w.int(c.flow.unprocessed.load(ordering: .relaxed))
            w.raw(",\"coalescing\":"); w.raw(c.coalescing != 0 ? "true" : "false")
            w.raw(",\"waiting\":"); w.raw(c.isWaiting ? "true" : "false")
            w.raw("}")
        }
        w.raw("]")
    }

    /// Entities, documents and live subscriptions, for the driver's logs.
    public var counts: (entities: Int, documents: Int, collections: Int, subscriptions: Int) {
        (store.entities.count, store.documents.count, store.collections.count, subscriptionCount)
    }
}
