import ConcordJSON
import ConcordProtocol

/// Where a host stands with the cluster log (PROTOCOL.md §8.7).
public enum ClusterLinkState: String, Sendable {
    case attached
    case detached
    case catchingUp = "catching_up"
    case resyncing
}

/// One entry of the cluster log as a host reads it back: the mutations one
/// host appended in one window, in the order they are applied.
public struct ClusterEntry: Sendable {
    /// Position in the log (1, 2, …; a rejected mutation takes a position, not a seq).
    public var offset: Int
    /// The chain hash before and after this entry (`h = sha1hex(prev .. token)`).
    public var previousHash: String
    public var hash: String
    /// The log's epoch (a new one when the log was wiped).
    public var epoch: String
    /// The appender's wall clock (the log server's TIME), seconds: "now" for
    /// everything the apply needs a time for (token retention).
    public var time: Double
    /// The appending host's run (``ClusterSettings/origin``).
    public var origin: String
    /// Each mutation's reference on its host, and its request (canonical JSON).
    public var mutations: [(ref: Int, line: [UInt8])]
    /// The log's own id of the entry (a Redis stream id), for trimming below a snapshot.
    public var streamID: String

    public init(offset: Int, previousHash: String, hash: String, epoch: String, time: Double, origin: String,
                mutations: [(ref: Int, line: [UInt8])], streamID: String = "") {
        self.streamID = streamID
        self.offset = offset
        self.previousHash = previousHash
        self.hash = hash
        self.epoch = epoch
        self.time = time
        self.origin = origin
        self.mutations = mutations
    }

    /// `m`: one line per mutation, `REF SP REQUEST`.
    public static func encode(_ mutations: [(ref: Int, line: [UInt8])]) -> [UInt8] {
        var out: [UInt8] = []
        for (ref, line) in mutations {
            out.append(contentsOf: String(ref).utf8)
            out.append(0x20)
            out.append(contentsOf: line)
            out.append(0x0A)
        }
        return out
    }

    /// The inverse of ``encode(_:)``; nil when the bytes are not such lines.
    public static func decode(_ bytes: some Collection<UInt8>) -> [(ref: Int, line: [UInt8])]? {
        var out: [(ref: Int, line: [UInt8])] = []
        var it = Array(bytes)[...]
        while !it.isEmpty {
            guard let sp = it.firstIndex(of: 0x20), let nl = it[sp...].firstIndex(of: 0x0A),
                  let ref = Int(String(decoding: it[..<sp], as: UTF8.self)) else { return nil }
            out.append((ref, Array(it[(sp + 1)..<nl])))
            it = it[(nl + 1)...]
        }
        return out
    }
}

/// Cluster mode's settings, as the driver starts it.
public struct ClusterSettings: Sendable {
    /// The cluster's name (`--cluster-name`): the log's keys are `concord:{NAME}:…`.
    public var name: String
    /// This host's name for people (`hello.cluster.host`).
    public var host: String
    /// This process run, unique in the cluster: entries it appended are answered by it.
    public var origin: String
    /// Seconds a mutation waits for the log before it is answered
    /// `unavailable` (with `indeterminate` when it may still be applied).
    public var timeout: Double

    public init(name: String, host: String, origin: String, timeout: Double = 5) {
        self.name = name
        self.host = host
        self.origin = origin
        self.timeout = timeout
    }
}

/// What the driver learns about the log, for the core.
public enum ClusterLogEvent: Sendable {
    /// Connected and heartbeating: the log's epoch and head offset (0 when
    /// the log is empty or not created yet: epoch ""). `rolledBack`: the
    /// head is below an offset this host read before asking (the log lost
    /// acknowledged entries: a restart from an older copy, a failover).
    case attached(epoch: String, head: Int, rolledBack: Bool = false)
    /// The log cannot be reached (no heartbeat answer within a second, or the connection failed).
    case detached(reason: String)
    /// The log's head offset (answers ``Engine/clusterHeadWanted``).
    case head(Int)
    /// Appends that did not go in: `indeterminate` when they may have.
    case appendFailed(refs: [Int], indeterminate: Bool, reason: String)
    /// Appends the log took (or had taken: a retried token): their apply
    /// gets its own `--cluster-timeout` from now, and if this host does not
    /// reach them in it the answer says they are in the log.
    case appendConfirmed(refs: [Int])
    /// The host cannot follow the log (a snapshot it needs is missing or damaged).
    case broken(reason: String)
    /// Another host's state digest at `offset` differs from this host's: an alarm (`stats`, the log).
    case digestMismatch(offset: Int, detail: String)
}

/// The core's cluster state: all of it on the sequencer thread.
final class ClusterState {
    let settings: ClusterSettings
    var link = ClusterLinkState.detached
    var detachedReason = "not connected to the cluster log yet"
    var epoch = ""
    var appliedOffset = 0
    var lastHash = ""
    var lastStreamID = ""
    var headOffset = 0
    var resyncs = 0
    var nextRef = 1
    /// Mutations of this host's clients appended (or about to be) and not applied yet.
    var pending: [Int: (client: ClientSession, rid: JSON, deadline: Double, confirmed: Bool)] = [:]
    /// To hand to the driver: what to append, in order.
    var appends: [(ref: Int, line: [UInt8])] = []
    /// Connections whose `sync` (or cluster `since`) waits for the log's head.
    var syncWaiters: [ClientSession] = []
    var headWanted = false
    /// During the apply of an entry: its time ("now" for token retention).
    var entryTime: Double?
    /// Receives the answers to mutations of other hosts (written nowhere).
    let sink: ClientSession
    /// Why the log cannot be followed any more (a gap, a rollback, a new epoch).
    var broken: String?
    /// Rebuilding after the log lost entries (Engine+ClusterResync.swift): the
    /// engine that follows the log's truth, this host's rebase entry, and
    /// whether the driver was asked for the truth.
    var shadow: Engine?
    var rebaseRef: Int?
    var resyncRequested = false
    /// In a shadow: the answers to mutations of this origin (the host being
    /// rebuilt), by reference, for the host to write to their connections.
    var captureOrigin: String?
    var captured: [(ref: Int, bytes: [UInt8])] = []
    /// State digests that differed from another host's, and the last one.
    var digestMismatches = 0
    var lastMismatch: String?
    /// The hashes of the last entries applied, by offset: an entry read
    /// again must be the same one (else the log was rolled back).
    var recentHashes: [Int: String] = [:]
    static let recentHashCount = 1024
    /// Entries behind the log's head past which a host says `catching_up` (it serves meanwhile).
    static let catchUpLag = 256
    /// Mutations of one connection in the log at once (memory is bounded by
    /// configuration, not by how fast the log answers).
    static let maxPendingPerConnection = 1024
    /// See ``Engine/clusterOutcomeDigest``.
    var outcomes: UInt64 = FNV1a().value

    static func fold(_ h: UInt64, _ s: String) -> UInt64 {
        var f = FNV1a()
        f.add(withUnsafeBytes(of: h.littleEndian) { Array($0) })
        f.add(s.utf8)
        return f.value
    }

    init(settings: ClusterSettings) {
        self.settings = settings
        sink = ClientSession(id: -1, flow: ConnectionFlow())
        sink.closed = true
    }
}

/// A `sync` (or a `since` the host has not reached) waiting for the log.
struct SyncWait {
    var rid: JSON
    var deadline: Double
    /// The log offset to reach; nil until the head is known.
    var target: Int?
    /// Run the request again once reached (a `since`), instead of answering `seq`.
    var rerun: Bool
}

/// Cluster mode (PROTOCOL.md §8): mutations go to the log and are applied
/// when read back from it, in log order, on every host alike.
extension Engine {
    /// Turns cluster mode on (before any connection).
    public func enableCluster(_ settings: ClusterSettings) {
        cluster = ClusterState(settings: settings)
    }

    public var isClustered: Bool { cluster != nil }

    /// "Now" for token retention: the log entry's time while one is applied.
    var versionsNow: Double { cluster?.entryTime ?? clock() }

    /// Appends for the driver, in order (taken once).
    public func takeClusterAppends() -> [(ref: Int, line: [UInt8])] {
        guard let cl = cluster, !cl.appends.isEmpty else { return [] }
        defer { cl.appends.removeAll(keepingCapacity: true) }
        return cl.appends
    }

    /// True once when a `sync` needs the log's head offset.
    public func takeClusterHeadWanted() -> Bool {
        guard let cl = cluster, cl.headWanted else { return false }
        cl.headWanted = false
        return true
    }

    public var clusterAppliedOffset: Int { cluster?.appliedOffset ?? 0 }
    public var clusterEpoch: String { cluster?.epoch ?? "" }
    public var clusterLink: ClusterLinkState? { cluster?.link }
    /// Whether the core can take more entries (it is following the log).
    public var clusterBroken: String? { cluster?.broken }

    /// Requests that go through the log: every mutation, and `schema` with lists (§8.6).
    func goesThroughLog(_ r: Request) -> Bool {
        switch r.op {
        case .mutation: return true
        case .schema(let lists): return lists != nil
        default: return false
        }
    }

    /// A mutation of a local client: checked for what only this connection
    /// can know (its `origin` subscriptions), then appended; the connection
    /// waits until the log brings it back (its answer is written then).
    func appendToLog(_ r: Request, _ value: JSON, _ c: ClientSession, _ cl: ClusterState) throws(ProtocolError) {
        guard cl.link == .attached || cl.link == .catchingUp, cl.broken == nil else {
            throw ProtocolError(.unavailable, "the cluster log cannot be reached (\(cl.broken ?? cl.detachedReason)); nothing was applied")
        }
        if case .mutation(let m, let options) = r.op {
            if let o = options.origin, c.subs[o] == nil {
                throw ProtocolError(.noSuchSub, "origin '\(clipID(o))' is not a live subscription of this connection")
            }
            if case .batch(let ops) = m {
                for (i, op) in ops.enumerated() {
                    if let o = op.origin, c.subs[o] == nil {
                        throw ProtocolError(.noSuchSub, "ops[\(i)]: origin '\(clipID(o))' is not a live subscription of this connection")
                    }
                }
            }
        }
        let ref = cl.nextRef
        cl.nextRef += 1
        var w = JSONWriter(capacity: 256)
        w.value(value)
        cl.appends.append((ref, w.bytes))
        cl.pending[ref] = (c, r.rid, clock() + cl.settings.timeout, false)
        c.logPending.append(ref)
    }

    /// A line for a connection whose own mutations are in the log: appended
    /// too when it is a mutation that goes there as it stands; anything else
    /// (a read, a line that does not decode, a refusal) waits its turn, so
    /// that its answer follows theirs. Returns whether it was appended.
    func appendBehindPending(_ parsed: ParsedLine, _ c: ClientSession, _ cl: ClusterState) -> Bool {
        // A bound per connection: past it the line waits in the backlog, the
        // connection's lane stops feeding, and the server stops reading it.
        guard c.logPending.count < ClusterState.maxPendingPerConnection, let value = parsed.json, !isShuttingDown, cl.link == .attached || cl.link == .catchingUp, cl.broken == nil,
              let request = parsed.decoded ?? (try? Request.decode(value, idKey: configuration.idKey)), goesThroughLog(request) else { return false }
        c.requests += 1
        do {
            try appendToLog(request, value, c, cl)
            return true
        } catch {
            c.requests -= 1
            return false
        }
    }

    /// The oldest of the connection's mutations in the log is resolved (answered
    /// by the caller when `answered`); failures that waited behind it follow.
    func popLogPending(_ c: ClientSession, _ ref: Int) {
        if let i = c.logPending.firstIndex(of: ref) { c.logPending.remove(at: i) }
        while let next = c.logPending.first, let f = c.logFailures.removeValue(forKey: next) {
            c.logPending.removeFirst()
            respondError(c, rid: f.rid, f.error)
        }
    }

    /// Mutation `ref` of `c` came back from the log: the connection's older
    /// mutations still waiting are answered first, so answers stay in request
    /// order. One host's appends enter the log in the order they were made,
    /// so an older one still waiting is an entry the log lost (a failover
    /// that dropped the log's tail while this one was appended after it);
    /// the driver may still hold it, so its outcome is not known. A failure
    /// that waited behind it is answered in its turn.
    func answerOlderLogPending(_ c: ClientSession, before ref: Int, _ cl: ClusterState) {
        guard c.logPending.first != ref, c.logPending.contains(ref) else { return }
        while let head = c.logPending.first, head != ref {
            c.logPending.removeFirst()
            if let f = c.logFailures.removeValue(forKey: head) {
                respondError(c, rid: f.rid, f.error)
                continue
            }
            let older = cl.pending.removeValue(forKey: head)
            respondError(c, rid: older?.rid ?? .null, ProtocolError(
                .unavailable, "the cluster log lost this mutation's entry; it may still be applied, once — retry with the same token to learn its outcome",
                details: [("indeterminate", .bool(true))]))
        }
    }

    /// `sync` in cluster mode: waits for the log's head, then for this host to apply it.
    func parkForSync(_ c: ClientSession, _ parsed: ParsedLine, rid: JSON, timeoutMs: Int?, rerun: Bool, _ cl: ClusterState) {
        c.waitingSync = SyncWait(rid: rid, deadline: clock() + Double(timeoutMs ?? 5000) / 1000, target: nil, rerun: rerun)
        if rerun { c.backlog.insert(parsed, at: c.backlogHead) }
        cl.syncWaiters.append(c)
        cl.headWanted = true
    }

    /// What the driver learned about the log.
    public func clusterEvent(_ event: ClusterLogEvent) {
        guard let cl = cluster else { return }
        switch event {
        case .attached(let epoch, let head, let rolledBack):
            cl.headOffset = max(cl.headOffset, head)
            if !cl.epoch.isEmpty, !epoch.isEmpty, epoch != cl.epoch, cl.broken == nil {
                cl.broken = "the log was recreated (epoch \(epoch), this host applied epoch \(cl.epoch)); rebuilding from a snapshot is not built yet"
            } else if rolledBack, cl.broken == nil {
                cl.broken = "the log lost entries (its head went back to \(head), this host had read further); rebuilding from a snapshot is not built yet"
            }
            if cl.broken != nil {
                cl.link = .resyncing
            } else {
                cl.link = head - cl.appliedOffset > ClusterState.catchUpLag ? .catchingUp : .attached
            }
            if !cl.syncWaiters.isEmpty { cl.headWanted = true }
        case .detached(let reason):
            cl.link = .detached
            cl.detachedReason = reason
        case .digestMismatch(let offset, let detail):
            cl.digestMismatches += 1
            cl.lastMismatch = "offset \(offset): \(detail)"
        case .broken(let reason):
            if cl.broken == nil { cl.broken = reason }
            cl.link = .resyncing
        case .head(let head):
            cl.headOffset = max(cl.headOffset, head)
            for c in cl.syncWaiters where c.waitingSync != nil && c.waitingSync!.target == nil {
                c.waitingSync!.target = head
            }
            serviceSyncWaiters(now: nil)
        case .appendConfirmed(let refs):
            let deadline = clock() + cl.settings.timeout
            for ref in refs where cl.pending[ref] != nil {
                cl.pending[ref]!.deadline = deadline
                cl.pending[ref]!.confirmed = true
            }
        case .appendFailed(let refs, let indeterminate, let reason):
            if let r = cl.rebaseRef, refs.contains(r) {
                // The rebuild's rebase did not go in: start the rebuild over.
                cl.shadow = nil
                cl.rebaseRef = nil
                cl.resyncRequested = false
            }
            var touched: [ClientSession] = []
            for ref in refs.sorted() {
                guard let p = cl.pending.removeValue(forKey: ref) else { continue }
                guard clients[p.client.id] === p.client else { continue }
                let e = indeterminate
                    ? ProtocolError(.unavailable, "the outcome of the mutation is not known (\(reason)); it may still be applied, once — retry with the same token to learn its outcome",
                                    details: [("indeterminate", .bool(true))])
                    : ProtocolError(.unavailable, "the cluster log refused or could not take the mutation (\(reason)); nothing was applied")
                if p.client.logPending.first == ref {
                    respondError(p.client, rid: p.rid, e)
                    popLogPending(p.client, ref)
                } else {
                    // An older mutation of this connection is still in the log: this answer comes after its.
                    p.client.logFailures[ref] = (p.rid, e)
                }
                if !touched.contains(where: { $0 === p.client }) { touched.append(p.client) }
            }
            for c in touched { drain(c) }
        }
    }

    /// Applies one entry read back from the log. Returns false (and applies
    /// nothing) when it does not follow what this host applied: the log lost
    /// entries or was replaced — the host stops following it (`resyncing`).
    @discardableResult
    public func applyClusterEntry(_ entry: ClusterEntry) -> Bool {
        guard let cl = cluster else { return false }
        if let shadow = cl.shadow { return applyToShadow(entry, cl, shadow) }
        guard cl.broken == nil else { return false }
        // Read again (a reader that reconnected from an older position):
        // applied already — unless it is not the entry this host applied
        // there (the log was rolled back and grew again).
        if entry.epoch == cl.epoch, entry.offset <= cl.appliedOffset {
            guard let known = cl.recentHashes[entry.offset], known != entry.hash else { return true }
            cl.broken = "the log's entry at offset \(entry.offset) is not the one this host applied there (the log lost entries and grew again)"
            cl.link = .resyncing
            return false
        }
        if !cl.epoch.isEmpty, entry.epoch != cl.epoch {
            cl.broken = "the log was recreated (epoch \(entry.epoch) after \(cl.epoch)); rebuilding from a snapshot is not built yet"
        } else if entry.offset != cl.appliedOffset + 1 {
            cl.broken = "the log skips from offset \(cl.appliedOffset) to \(entry.offset); rebuilding from a snapshot is not built yet"
        } else if entry.previousHash != cl.lastHash {
            cl.broken = "the log's hash chain does not continue this host's at offset \(entry.offset) (it lost entries and grew again); rebuilding from a snapshot is not built yet"
        }
        if cl.broken != nil {
            cl.link = .resyncing
            return false
        }
        cl.epoch = entry.epoch
        cl.appliedOffset = entry.offset
        cl.lastHash = entry.hash
        cl.lastStreamID = entry.streamID
        cl.recentHashes[entry.offset] = entry.hash
        cl.recentHashes[entry.offset - ClusterState.recentHashCount] = nil
        cl.entryTime = entry.time
        defer { cl.entryTime = nil }
        let mine = entry.origin == cl.settings.origin
        let before = seq
        for (ref, line) in entry.mutations {
            // A host's rebase after a rebuild: numbers never go backwards anywhere.
            if let n = Self.rebaseSeq(line) {
                seq = max(seq, n)
                cl.outcomes = ClusterState.fold(cl.outcomes, "\(entry.offset) \(ref) rebase \(seq)")
                continue
            }
            var session = cl.sink
            if mine, let p = cl.pending.removeValue(forKey: ref), clients[p.client.id] === p.client {
                session = p.client
                answerOlderLogPending(session, before: ref, cl)
            }
            let outcome = applyLogged(Self.parse(line, parser: parser), session)
            cl.outcomes = ClusterState.fold(cl.outcomes, "\(entry.offset) \(ref) \(outcome)")
            if session === cl.sink {
                if let o = cl.captureOrigin, o == entry.origin {
                    var bytes: [UInt8] = []
                    for chunk in cl.sink.output.take() { bytes.append(contentsOf: UnsafeRawBufferPointer(start: chunk.base, count: chunk.count)) }
                    cl.captured.append((ref, bytes))
                }
                cl.sink.output = OutputQueue()
            } else {
                // The connection's oldest in the log now (older ones were answered above).
                popLogPending(session, ref)
                drain(session)
            }
        }
        cl.headOffset = max(cl.headOffset, cl.appliedOffset)
        if cl.link == .catchingUp, cl.headOffset - cl.appliedOffset <= ClusterState.catchUpLag { cl.link = .attached }
        if seq != before && !seqWaiters.isEmpty { wakeSeqWaiters() }
        if !cl.syncWaiters.isEmpty { serviceSyncWaiters(now: nil) }
        checkInvariantsIfEnabled()
        return true
    }

    /// One mutation from the log: decoded and applied as on a single server.
    /// Its outcome depends only on the state and the request: the checks
    /// that depend on one host (the connection's `origin` subscriptions, the
    /// backend) happened before it was appended.
    /// Returns its outcome: `ok SEQ` or the error code.
    private func applyLogged(_ parsed: ParsedLine, _ c: ClientSession) -> String {
        guard let request = parsed.decoded ?? parsed.json.flatMap({ try? Request.decode($0, idKey: configuration.idKey) }) else {
            // Appended only after decoding: a line that does not decode is another engine version's.
            if c !== cluster?.sink { respondError(c, rid: .null, ProtocolError(.internal, "a log entry did not decode on this host")) }
            return "undecodable"
        }
        requestsByOp[request.op.metricIndex] += 1
        // The model sent as the log line holds it (as `process` does).
        beginVerbatim(parsed)
        defer { endVerbatim() }
        do {
            try dispatch(request, c, fromLog: true)
            return "ok \(seq)"
        } catch {
            respondError(c, rid: request.rid, error)
            return error.code.rawValue
        }
    }

    /// A running hash of every applied mutation's outcome (offset, ref,
    /// `ok SEQ` or the error code): equal on hosts that agree.
    public var clusterOutcomeDigest: UInt64 { cluster?.outcomes ?? 0 }

    /// Answers the `sync` waits whose offset is reached; with `now`, those past their deadline.
    func serviceSyncWaiters(now: Double?) {
        guard let cl = cluster else { return }
        let waiting = cl.syncWaiters
        cl.syncWaiters = []
        for c in waiting {
            guard clients[c.id] === c, let w = c.waitingSync else { continue }
            if let t = w.target, cl.appliedOffset >= t {
                c.waitingSync = nil
                if !w.rerun { respond(c, rid: w.rid, seq: seq) }
                drain(c, rerunning: w.rerun)
            } else if let now, now >= w.deadline || isShuttingDown {
                c.waitingSync = nil
                if w.rerun { _ = c.popBacklog() }
                respondError(c, rid: w.rid, isShuttingDown ? ProtocolError(.shuttingDown, "the server is shutting down")
                                 : ProtocolError(.unavailable, "this host did not reach the cluster log's head within the timeout (applied offset \(cl.appliedOffset), seq \(seq))"))
                drain(c)
            } else {
                cl.syncWaiters.append(c)
            }
        }
    }

    /// Ends the waits past their deadline: mutations the log did not bring
    /// back (`indeterminate`: they may still be applied) and `sync`s.
    public func expireClusterWaits() {
        guard let cl = cluster else { return }
        let now = clock()
        if !cl.pending.isEmpty {
            var late: [Int] = [], lateInLog: [Int] = []
            for (ref, p) in cl.pending where now >= p.deadline || isShuttingDown {
                if p.confirmed { lateInLog.append(ref) } else { late.append(ref) }
            }
            if !late.isEmpty {
                late.sort()
                clusterEvent(.appendFailed(refs: late, indeterminate: true, reason: "the cluster log did not answer within \(cl.settings.timeout) s"))
            }
            if !lateInLog.isEmpty {
                lateInLog.sort()
                clusterEvent(.appendFailed(refs: lateInLog, indeterminate: true, reason: isShuttingDown
                    ? "it is in the cluster log, and this host shut down before applying it"
                    : "it is in the cluster log, and this host did not apply it within \(cl.settings.timeout) s of the log's answer"))
            }
        }
        if !cl.syncWaiters.isEmpty { serviceSyncWaiters(now: now) }
    }

    public var hasClusterWaits: Bool {
        guard let cl = cluster else { return false }
        return !cl.pending.isEmpty || !cl.syncWaiters.isEmpty
    }

    /// `"cluster":{…}` of `ping` and `stats` (§8.7).
    func writeClusterStatus(_ w: inout JSONWriter, _ cl: ClusterState) {
        w.key("cluster")
        w.raw("{\"state\":"); w.string(cl.link.rawValue)
        w.raw(",\"epoch\":"); w.string(cl.epoch)
        w.raw(",\"applied_offset\":"); w.int(cl.appliedOffset)
        w.raw(",\"seq\":"); w.int(seq)
        w.raw(",\"lag_entries\":"); w.int(max(0, cl.headOffset - cl.appliedOffset))
        w.raw(",\"resyncs\":"); w.int(cl.resyncs)
        w.raw(",\"name\":"); w.string(cl.settings.name)
        w.raw(",\"host\":"); w.string(cl.settings.host)
        w.raw(",\"pending\":"); w.int(cl.pending.count)
        w.raw(",\"digest_mismatches\":"); w.int(cl.digestMismatches)
        if let m = cl.lastMismatch { w.raw(",\"last_digest_mismatch\":"); w.string(m) }
        if let b = cl.broken { w.raw(",\"problem\":"); w.string(b) }
        w.raw("}")
    }

    /// An order-independent hash of the whole state (entities, documents,
    /// collections, schema, seq): equal on hosts that applied the same log.
    /// FNV-1a over canonical encodings, summed — not `Hasher`, whose seed
    /// differs per process.
    public func stateDigest() -> UInt64 {
        func fnv(_ tag: UInt8, _ name: String, _ value: JSON?) -> UInt64 {
            var h = FNV1a()
            h.add(tag)
            h.add(name.utf8)
            h.add(0)
            if let value {
                var w = JSONWriter(capacity: 64)
                w.value(value)
                h.add(w.bytes)
            }
            return h.value
        }
        var sum: UInt64 = fnv(0x73, String(seq), nil)
        for id in store.entities.keys { sum &+= fnv(0x65, id, store.entity(id)) }
        for key in store.documents.keys { sum &+= fnv(0x64, key, store.document(key)) }
        for name in store.collections.keys { sum &+= fnv(0x63, name, .array(store.collectionItems(name))) }
        var sw = JSONWriter(capacity: 64)
        RecordCodec.writeSchema(&sw, store.requiredLists)
        sum &+= fnv(0x72, String(decoding: sw.bytes, as: UTF8.self), nil)
        // What else decides outcomes: last-change seqs (tombstones included) and tokens.
        for (id, s) in versions.entities { sum &+= fnv(0x45, id, .int(s)) }
        for (key, s) in versions.documents { sum &+= fnv(0x44, key, .int(s)) }
        for (name, s) in versions.collections { sum &+= fnv(0x43, name, .int(s)) }
        for (token, s) in versions.tokens { sum &+= fnv(0x54, token, .int(s)) }
        sum &+= fnv(0x46, "\(versions.floor) \(versions.clearedAt)", nil)
        return sum
    }
}
