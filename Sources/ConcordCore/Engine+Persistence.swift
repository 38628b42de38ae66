public import ConcordJSON
import ConcordProtocol

/// When a mutation is acknowledged relative to the cache backend.
public enum Durability: String, Sendable {
    /// Acknowledge at once; the write reaches the backend shortly after (write-behind).
    case async
    /// Acknowledge only after the backend confirmed the write.
    case sync
}

/// Work for the storage thread, in the order the core produced it.
public enum StorageItem: Sendable {
    /// The records one mutation (or a schema change, or a repair) wrote; nil values are deletes.
    case write(seq: Int, writes: [StorageWrite])
    /// `clear`: the backend is emptied (then the schema is written again).
    case clear(seq: Int, schema: [(type: String, members: [String])])
    /// Read these keys and everything they reference.
    case load(LoadRequest)
    /// Store a reservation of sequence numbers up to this one.
    case reserve(upTo: Int)
}

public struct StorageWrite: Sendable {
    /// `e:<id>`, `d:<key>`, `c:<name>` or `s:schema` (``RecordCodec``).
    public var key: String
    /// Materialized; the storage thread normalizes and encodes it. nil: delete.
    public var value: StoredValue?
    /// The seq of the record's last change when known (stored with it), else 0.
    public var changedAt: Int = 0
}

public enum StoredValue: Sendable {
    case entity(JSON)
    case document(JSON)
    case collection([String])
    case schema([(type: String, members: [String])])
    /// A remembered token: the seq of the mutation that carried it.
    case token(Int)
}

public struct LoadRequest: Sendable {
    public var ticket: Int
    public var keys: [String]
    /// Key prefixes to list in full (`e:<Type>:`: every entity of a type, for a live query).
    public var scanPrefixes: [String] = []
}

/// What the storage thread read for a ``LoadRequest``: normalized records.
public struct LoadResult: Sendable {
    public enum Record: Sendable {
        case entity(JSON)
        case document(JSON)
        case collection([String])
        case token(Int)
    }
    public var ticket: Int
    public var records: [String: Record]
    /// Key → the seq of the record's last change, when the record stores it.
    public var changedAt: [String: Int] = [:]
    public var absent: [String]
    /// The prefixes that were listed (all of them, unless the backend cannot list).
    public var scanned: [String] = []
    /// Set when the backend failed: the waiting request is answered `cache_error`.
    public var error: String?

    public init(ticket: Int, records: [String: Record] = [:], absent: [String] = [], error: String? = nil) {
        self.ticket = ticket
        self.records = records
        self.absent = absent
        self.error = error
    }
}

/// A read-through load in flight.
final class LoadTicket {
    /// Storage keys written since the load was asked for: the load's copies of them are stale.
    var touched: Set<String> = []
    var clients: [ClientSession] = []
}

/// Persistence state of the engine (present when a cache backend is configured).
final class PersistenceState {
    var durability: Durability
    var items: [StorageItem] = []
    var nextTicket = 1
    var tickets: [Int: LoadTicket] = [:]
    /// Keys known to be in neither memory nor the backend. A document with a
    /// key subscription is left out: the key table covers it (`missingKeys`).
    var knownAbsent: Set<String> = []
    var committedSeq = 0
    var durableWaiters: [ClientSession] = []
    /// Storage key → seq of its last queued write: records newer than
    /// `committedSeq` are not in the backend yet and must stay in memory.
    var lastWrite: [String: Int] = [:]
    /// Keys used since the eviction clock last passed them (second chance).
    var recentlyUsed: Set<String> = []
    /// Sequence numbers up to this one are reserved in the backend; none beyond is issued.
    var seqReserved = Int.max
    var reservationAsked = 0
    /// Set while the backend fails to store (its last message).
    var failing: String?
    /// Records written since the last confirmed store (an upper bound of the backlog).
    var unstored = 0
    /// While failing, mutations are refused once `unstored` is over this.
    var maxUnstored = 100_000
    /// Types whose every entity was read from the backend (for live queries):
    /// they stay resident while a query of the type lives.
    var loadedTypes: Set<String> = []

    init(durability: Durability) { self.durability = durability }
}

extension Engine {
    /// Turns on write-behind and read-through. `schema` is what the backend held at start-up.
    /// `lastSeq`: the last number that may have been issued before; `reserved`:
    /// numbers up to which the backend holds a reservation (none beyond is issued).
    public func enablePersistence(durability: Durability, schema: [(type: String, members: [String])]?, lastSeq: Int = 0,
                                  reserved: Int = Int.max, maxUnstored: Int = 100_000) {
        let p = PersistenceState(durability: durability)
        p.seqReserved = reserved
        p.reservationAsked = reserved
        p.committedSeq = lastSeq
        p.maxUnstored = maxUnstored
        persistence = p
        if let schema { store.setSchema(schema) }
        seq = lastSeq
        // What changed before this process started is not known per record.
        versions.floor = lastSeq
    }

    /// Numbers asked for in one reservation.
    public static let reservationBlock = 1 << 20

    /// The last mutation the backend confirmed (every mutation when there is no backend).
    public var durableSeq: Int { persistence?.committedSeq ?? seq }

    /// Refuses a mutation before it is applied when the backend cannot take it (§ durability in docs/PROTOCOL.md).
    func checkWritable() throws(ProtocolError) {
        guard let p = persistence else { return }
        if let m = p.failing {
            if p.durability == .sync {
                throw ProtocolError(.cacheError, "the cache backend is failing to store (\(m)); with sync durability nothing is applied until it stores again")
            }
            if p.unstored > p.maxUnstored {
                throw ProtocolError(.cacheError, "the cache backend is failing to store (\(m)) and \(p.unstored) records wait for it (limit \(p.maxUnstored)); nothing was applied")
            }
        }
        if seq >= p.seqReserved {
            throw ProtocolError(.cacheError, "sequence numbers beyond \(p.seqReserved) are not reserved in the cache backend yet; nothing was applied")
        }
    }

    /// Asks for the next reservation once half of the current one is used.
    func reserveAhead() {
        guard let p = persistence, p.seqReserved != Int.max else { return }
        if seq > p.seqReserved - Self.reservationBlock / 2 && p.reservationAsked < seq + Self.reservationBlock {
            p.reservationAsked = seq + Self.reservationBlock
            p.items.append(.reserve(upTo: p.reservationAsked))
        }
    }

    /// The backend failed to store (the writes stay queued and are retried).
    public func storageFailing(message: String, backlog: Int) {
        guard let p = persistence else { return }
        p.failing = message
        p.unstored = max(p.unstored, backlog)
    }

    /// Storage work queued since the last call, in order.
    public func takeStorageItems() -> [StorageItem] {
        guard let p = persistence, !p.items.isEmpty else { return [] }
        defer { p.items.removeAll(keepingCapacity: true) }
        return p.items
    }

    public var hasStorageWork: Bool { !(persistence?.items.isEmpty ?? true) }

    // MARK: Write-behind

    /// Queues what the running mutation wrote. Call before `store.commit()`.
    func recordWrites(token: String? = nil, expiredTokens: [String] = []) {
        guard let p = persistence else { return }
        var writes: [StorageWrite] = []
        if let token { writes.append(StorageWrite(key: RecordCodec.tokenKey(token), value: .token(seq))) }
        for t in expiredTokens { writes.append(StorageWrite(key: RecordCodec.tokenKey(t), value: nil)) }
        for (id, _) in store.entityJournal {
            let v = store.entity(id)
            writes.append(StorageWrite(key: RecordCodec.entityKey(id), value: v.map { .entity($0) }, changedAt: versions.entities[id] ?? 0))
        }
        for (key, _) in store.documentJournal {
            let v = store.document(key)
            writes.append(StorageWrite(key: RecordCodec.documentKey(key), value: v.map { .document($0) }, changedAt: versions.documents[key] ?? 0))
        }
        for name in store.touchedCollections {
            let v = store.collections[name]
            writes.append(StorageWrite(key: RecordCodec.collectionKey(name), value: v.map { .collection($0.ids) },
                                       changedAt: versions.collections[name] ?? 0))
        }
        for w in writes {
            for t in p.tickets.values { t.touched.insert(w.key) }
            p.lastWrite[w.key] = seq
            if w.value == nil {
                if p.knownAbsent.count > 1_000_000 { p.knownAbsent.removeAll() }
                p.knownAbsent.insert(w.key)
            } else {
                p.knownAbsent.remove(w.key)
            }
        }
        p.items.append(.write(seq: seq, writes: writes))
        p.unstored += writes.count
        reserveAhead()
    }

    func recordSchemaWrite() {
        guard let p = persistence else { return }
        p.items.append(.write(seq: seq, writes: [StorageWrite(key: RecordCodec.schemaKey, value: .schema(store.requiredLists))]))
    }

    func recordClear() {
        guard let p = persistence else { return }
        for t in p.tickets.values { t.touched.insert("*") }
        p.knownAbsent.removeAll()
        p.items.append(.clear(seq: seq, schema: store.requiredLists))
        reserveAhead()
    }

    /// The backend stored every write up to `seq` (and reserved numbers up to
    /// `reserved`): release held acknowledgements.
    public func storageCommitted(through seq: Int, reserved: Int = Int.max) {
        guard let p = persistence else { return }
        p.committedSeq = max(p.committedSeq, seq)
        if reserved != Int.max { p.seqReserved = max(p.seqReserved == Int.max ? 0 : p.seqReserved, reserved) }
        p.failing = nil
        p.unstored = 0
        if p.lastWrite.count > 4096 { p.lastWrite = p.lastWrite.filter { $0.value > p.committedSeq } }
        releaseDurable(upTo: p.committedSeq, failure: nil)
    }

    /// Held acknowledgements (sync) that the backend could not confirm in
    /// time are answered now: applied, with their seq, but not durable yet
    /// (the records stay in memory and are retried).
    public func releaseNotDurable(reason: String) {
        releaseDurable(upTo: Int.max, failure: reason)
    }

    private func releaseDurable(upTo seq: Int, failure: String?) {
        guard let p = persistence, !p.durableWaiters.isEmpty else { return }
        var still: [ClientSession] = []
        var ready: [ClientSession] = []
        for c in p.durableWaiters {
            if let s = c.waitingDurable, s <= seq { ready.append(c) } else { still.append(c) }
        }
        p.durableWaiters = still
        for c in ready {
            guard let held = c.heldResponse else { continue }
            if !c.coalesced.isEmpty { flushCoalesced(c) }
            if let failure {
                // Like MongoDB's writeConcernError: the write happened (it has a
                // seq, subscribers saw it), it is just not known to be stored.
                let s = c.waitingDurable ?? seq
                respond(c, rid: held.rid) { w in
                    w.key("seq"); w.int(s)
                    w.key("durable"); w.raw("false")
                    w.key("warning")
                    w.raw("{\"code\":\"cache_error\",\"message\":")
                    w.string("applied (seq \(s)) but not stored yet: \(failure); it stays in memory and storing is retried")
                    w.raw("}")
                }
            } else {
                c.output.append(held.bytes)
                responsesQueued += 1
                markDirty(c)
            }
            c.heldResponse = nil
            c.waitingDurable = nil
            drain(c)
        }
    }

    /// In sync mode a mutation's acknowledgement waits for the backend.
    /// Returns true when the response was held.
    func holdUntilDurable(_ c: ClientSession, rid: JSON) -> Bool {
        guard let p = persistence, p.durability == .sync else { return false }
        var w = JSONWriter(capacity: 48)
        w.raw("{\"rid\":")
        w.value(rid)
        w.raw(",\"ok\":true,\"seq\":")
        w.int(seq)
        w.raw("}\n")
        c.heldResponse = (rid, w.bytes)
        c.waitingDurable = seq
        p.durableWaiters.append(c)
        return true
    }

    // MARK: Read-through

    /// Storage keys a request needs in memory and that may be in the backend.
    func missingKeys(_ op: Operation) -> [String] {
        guard let p = persistence else { return [] }
        var keys: [String] = []
        func entity(_ id: String) {
            if store.entities[id] == nil { keys.append(RecordCodec.entityKey(id)) }
        }
        // A document with a key subscription is never evicted: it is in
        // memory or it is absent, and the key table says it is known.
        func document(_ k: String) {
            if store.documents[k] == nil && keyViews[k] == nil { keys.append(RecordCodec.documentKey(k)) }
        }
        func collection(_ n: String) {
            if store.collections[n] == nil { keys.append(RecordCodec.collectionKey(n)) }
        }
        func mutation(_ m: Mutation) {
            switch m {
            case .update(let model, _, let mode, _):
                if mode == .merge { for id in tree.flatten(model).ids { entity(id) } }
            case .collectionSet(let n, _), .collectionInsert(let n, _, _), .collectionRemoveAt(let n, _, _),
                 .collectionRemoveIDs(let n, _):
                collection(n)
            case .batch(let ops):
                for (o, _) in ops { mutation(o) }
            default:
                break
            }
        }
        switch op {
        case .get(.key(let k)): document(k)
        case .get(.id(let id)): entity(id)
        case .get(.collection(let n)): collection(n)
        case .subscribe(_, .key(let k)): document(k)
        case .subscribe(_, .collection(let n)): collection(n)
        case .subscribe(_, .ids(let list)): for id in list { entity(id) }
        case .subscribe(_, .model(let m, refresh: true)): for id in tree.identities(m).order { entity(id) }
        case .subscribe(_, .query(let q)), .get(.query(let q)):
            // Every entity of the type, once: a scan of the backend.
            // Only when the backend may hold entities memory does not: it
            // persists (a restart), or records are evicted (--memory-limit).
            if backendMayHoldMore && !p.loadedTypes.contains(q.type) && queries.types[q.type] == nil { keys.append(Self.scanMarker + RecordCodec.entityKey(q.type + ":")) }
        case .mutation(let m, let options):
            mutation(m)
            // A retry of a mutation accepted before a restart, or long enough
            // ago that memory let go of its token.
            if let t = options.token, versions.tokens[t] == nil { keys.append(RecordCodec.tokenKey(t)) }
            // A condition compares with the records themselves: everything it writes is read in.
            if options.ifUnchangedSince != nil {
                let w = writeSet(m)
                for id in w.entities { entity(id) }
                for k in w.keys { document(k) }
                for n in w.collections { collection(n) }
            }
        default: break
        }
        return keys.filter { !p.knownAbsent.contains($0) }
    }

    /// Marks the records a request reads or writes as recently used (eviction's second chance).
    func noteUse(_ op: Operation) {
        guard let p = persistence, memoryLimitEnabled else { return }
        switch op {
        case .get(.key(let k)), .subscribe(_, .key(let k)): p.recentlyUsed.insert(RecordCodec.documentKey(k))
        case .get(.id(let id)): p.recentlyUsed.insert(RecordCodec.entityKey(id))
        case .get(.collection(let n)), .subscribe(_, .collection(let n)): p.recentlyUsed.insert(RecordCodec.collectionKey(n))
        default: break
        }
    }

    var memoryLimitEnabled: Bool { memoryLimit > 0 }

    /// True when the backend may hold entities that are not in memory.
    var backendMayHoldMore: Bool { backendPersists || memoryLimit > 0 }

    /// Evicts records no view and no resident record references, and that the
    /// backend already holds, until `bytesInUse()` is under the limit (or
    /// nothing more can go). A CLOCK sweep: a recently used record gets a
    /// second chance. Returns how many records were evicted.
    @discardableResult
    public func evictIfOverLimit(bytesInUse: () -> Int) -> Int {
        guard let p = persistence, memoryLimit > 0, bytesInUse() > memoryLimit else { return 0 }
        var evicted = 0
        func clean(_ key: String) -> Bool { (p.lastWrite[key] ?? 0) <= p.committedSeq }
        func secondChance(_ key: String) -> Bool { p.recentlyUsed.remove(key) != nil }
        // Documents and collections first: evicting them frees their entities.
        for (key, _) in store.documents where keyViews[key] == nil {
            let k = RecordCodec.documentKey(key)
            if clean(k) && !secondChance(k) {
                store.evictDocument(key)
                versions.forget(document: key, seq: seq)
                evicted += 1
            }
        }
        for (name, _) in store.collections where collectionViews[name] == nil {
            let k = RecordCodec.collectionKey(name)
            if clean(k) && !secondChance(k) {
                store.setCollection(name, nil)
                versions.forget(collection: name, seq: seq)
                evicted += 1
            }
        }
        // Entities top-down: a record nobody references, then its children become candidates.
        var round = 0
        while round < 64 && bytesInUse() > memoryLimit * 9 / 10 {
            round += 1
            var candidates: [String] = []
            // Entities of a queried type stay: a query lists every one of them.
            for id in store.entities.keys where !store.isReferenced(id) && modelWatchers[id] == nil && idWatchers[id] == nil
                && queries.types[Tree.type(of: id)] == nil {
                let k = RecordCodec.entityKey(id)
                if clean(k) && !secondChance(k) { candidates.append(id) }
                if candidates.count >= 4096 { break }
            }
            if candidates.isEmpty { break }
            for id in candidates {
                store.evictEntity(id)
                versions.forget(entity: id, seq: seq)
            }
            evicted += candidates.count
        }
        store.commit()
        return evicted
    }

    /// Marks a "key" that asks for a scan of a prefix (`missingKeys` → `park`).
    static let scanMarker = "\u{0}scan:"

    /// Parks the client behind a load of `keys`; `line` is answered once they are in.
    func park(_ c: ClientSession, _ line: ParsedLine, keys: [String]) {
        guard let p = persistence else { return }
        let ticket = LoadTicket()
        ticket.clients.append(c)
        let n = p.nextTicket
        p.nextTicket += 1
        p.tickets[n] = ticket
        c.waitingTicket = n
        c.backlog.insert(line, at: c.backlogHead)
        let scans = keys.filter { $0.hasPrefix(Self.scanMarker) }.map { String($0.dropFirst(Self.scanMarker.count)) }
        p.items.append(.load(LoadRequest(ticket: n, keys: keys.filter { !$0.hasPrefix(Self.scanMarker) }, scanPrefixes: scans)))
    }

    /// Installs what a load read (unless written since), then resumes the
    /// requests that waited for it.
    public func install(_ result: LoadResult) {
        guard let p = persistence, let ticket = p.tickets.removeValue(forKey: result.ticket) else { return }
        if let error = result.error {
            failReads(ticket, "the cache backend failed to read: \(error)")
            return
        }
        if !ticket.touched.contains("*") {
            installRecords(result, skipping: ticket.touched)
            for prefix in result.scanned {
                if case (.entity, let type)? = RecordCodec.parse(key: prefix) { p.loadedTypes.insert(String(type.dropLast())) }
            }
            for key in result.absent where !ticket.touched.contains(key) && !isResident(key) {
                p.knownAbsent.insert(key)
            }
        }
        for c in ticket.clients where clients[c.id] === c {
            c.waitingTicket = nil
            drain(c)
        }
    }

    func isResident(_ key: String) -> Bool {
        guard let (kind, name) = RecordCodec.parse(key: key) else { return false }
        switch kind {
        case .entity: return store.entities[name] != nil
        case .document: return store.documents[name] != nil
        case .collection: return store.collections[name] != nil
        case .schema: return true
        case .token: return versions.tokens[name] != nil
        }
    }

    /// Materializes loaded records children first. A reference to an entity
    /// that is gone (deleted, or evicted by the backend) is pruned as a
    /// delete would (null, removed from arrays, or — a required member —
    /// the record itself is gone); such repairs are written back.
    private func installRecords(_ r: LoadResult, skipping touched: Set<String>) {
        var repairs: [StorageWrite] = []
        var inProgress: Set<String> = []
        let requiredFn: (String) -> Set<String>? = { self.store.requiredMembers($0) }
        func ensureEntity(_ id: String) -> Bool {
            if store.entities[id] != nil { return true }
            let key = RecordCodec.entityKey(id)
            guard !touched.contains(key), !inProgress.contains(id), case .entity(let rec)? = r.records[key] else { return false }
            inProgress.insert(id)
            var missing: Set<String> = []
            for child in tree.nestedEntities(rec).keys where !ensureEntity(child) { missing.insert(child) }
            inProgress.remove(id)
            if missing.isEmpty {
                store.installEntity(id, tree.substituteNested(rec) { self.store.entity($0) })
                return true
            }
            switch tree.prune(rec, deleted: missing, required: requiredFn, current: { self.store.entity($0) }) {
            case .deleted:
                repairs.append(StorageWrite(key: key, value: nil))
                return false
            case .kept(let v):
                store.installEntity(id, v)
                repairs.append(StorageWrite(key: key, value: .entity(v)))
                return true
            }
        }
        for (key, record) in r.records where !touched.contains(key) {
            guard let (kind, name) = RecordCodec.parse(key: key) else { continue }
            switch (kind, record) {
            case (.entity, _):
                _ = ensureEntity(name)
            case (.document, .document(let rec)):
                guard store.documents[name] == nil else { continue }
                var missing: Set<String> = []
                for child in tree.topEntities(rec).keys where !ensureEntity(child) { missing.insert(child) }
                if let root = rec.identity(idKey: configuration.idKey) {
                    if missing.contains(root) {
                        repairs.append(StorageWrite(key: key, value: nil))
                        continue
                    }
                    store.installDocument(name, store.entity(root)!)
                    continue
                }
                if missing.isEmpty {
                    store.installDocument(name, tree.substituteAny(rec) { self.store.entity($0) }.0)
                } else if case .kept(let v) = tree.prune(rec, deleted: missing, required: { _ in nil }, isRoot: false, current: { self.store.entity($0) }) {
                    store.installDocument(name, v)
                    repairs.append(StorageWrite(key: key, value: .document(v)))
                }
            case (.token, .token(let s)):
                if versions.tokens[name] == nil { versions.remember(token: name, seq: s, now: clock()) }
            case (.collection, .collection(let ids)):
                guard store.collections[name] == nil else { continue }
                let kept = ids.filter { ensureEntity($0) }
                store.installCollection(name, kept)
                if kept.count != ids.count { repairs.append(StorageWrite(key: key, value: .collection(kept))) }
            default:
                continue
            }
        }
        // The last changes the records stored, for those now in memory.
        for (key, s) in r.changedAt where s > 0 && !touched.contains(key) {
            guard let (kind, name) = RecordCodec.parse(key: key) else { continue }
            switch kind {
            case .entity: if store.entity(name) != nil, versions.entities[name] == nil { versions.entities[name] = s }
            case .document: if store.document(name) != nil, versions.documents[name] == nil { versions.documents[name] = s }
            case .collection: if store.collections[name] != nil, versions.collections[name] == nil { versions.collections[name] = s }
            default: break
            }
        }
        store.commit()
        if !repairs.isEmpty, let p = persistence { p.items.append(.write(seq: seq, writes: repairs)) }
    }

    // MARK: Waiting clients

    /// True while the connection's next request waits (a read-through load, a
    /// sync acknowledgement): its later lines must not be handed in yet.
    /// (A connection waiting only for its own mutations in the cluster log
    /// still takes lines: further mutations go to the log behind them.)
    public func isWaiting(_ id: ConnectionID) -> Bool {
        guard let c = clients[id] else { return false }
        return c.isWaiting && !c.onlyLogPending
    }

    public var waitingClientCount: Int { persistence == nil ? 0 : clients.values.reduce(0) { $0 + ($1.waitingTicket != nil || $1.waitingDurable != nil ? 1 : 0) } }
    public var hasWaitingClients: Bool { waitingClientCount > 0 }

    /// At the end of a shutdown that timed out: every waiting request is
    /// answered now (a held acknowledgement as not durable, a parked read as
    /// `cache_error`), and the lines behind it after it.
    public func abandonWaits(reason: String) {
        guard let p = persistence else { return }
        releaseDurable(upTo: Int.max, failure: reason)
        let tickets = p.tickets
        p.tickets = [:]
        for (_, ticket) in tickets { failReads(ticket, "the cache backend did not answer a read: \(reason)") }
    }

    /// Answers each request parked on `ticket` with `cache_error`, then what waited behind it.
    private func failReads(_ ticket: LoadTicket, _ message: String) {
        for c in ticket.clients where clients[c.id] === c {
            c.waitingTicket = nil
            if let line = c.popBacklog() {
                var rid = JSON.null
                if case .object(let o)? = line.json, let r = Request.rid(of: o) { rid = r }
                respondError(c, rid: rid, ProtocolError(.cacheError, message))
            }
            drain(c)
        }
    }

    // MARK: Backlog

    /// Answers queued lines until the client waits again or has none.
    func drain(_ c: ClientSession, rerunning: Bool = false) {
        if rerunning { c.rerunAfterSync = true }
        while true {
            if !c.isWaiting, let line = c.popBacklog() {
                process(line, c)
                continue
            }
            // Cluster mode: mutations queued behind the connection's own ones in
            // the log go to the log too, all of them, not one per answer.
            if let cl = cluster, c.waitsOnlyForLog, c.backlogHead < c.backlog.count,
               appendBehindPending(c.backlog[c.backlogHead], c, cl) {
                _ = c.popBacklog()
                continue
            }
            return
        }
    }
}
