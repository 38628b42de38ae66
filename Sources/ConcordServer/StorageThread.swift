import ConcordCore
import ConcordJSON
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// The one thread that talks to the cache backend.
///
/// It takes the core's storage items in order. Consecutive writes are
/// coalesced — the latest value per record — and applied as one atomic
/// `write_batch`, so a burst of updates costs one write per record. A load
/// first flushes the writes queued before it (so it never reads a value older
/// than one the core already wrote), then reads its keys and everything they
/// reference. One thread keeps that order simple; backend calls may block
/// without holding up the loop or the sequencer.
final class StorageThread: @unchecked Sendable {
    // Sendable: `queue`, `stopping`, `stopped`, `latestStats`, `shared*` are
    // guarded by `condition`; `backend`, `pending*`, `failure` and
    // `loggedBadRecords` belong to the thread.
    enum Event {
        /// Every write up to `seq` is stored, and sequence numbers up to `reserved`.
        case committed(seq: Int, reserved: Int)
        /// A write failed; it stays pending and is retried with backoff.
        /// Sent once per failure episode (and again when the backlog grows).
        case failing(message: String, backlog: Int)
        case loaded(LoadResult)
    }

    /// Sequence numbers reserved ahead of use (a restart continues after the reservation).
    static let reservationBlock = 1 << 20

    private let backend: Backend
    private let codec: RecordCodec
    private let logger: Logger
    private let post: @Sendable (Event) -> Void
    private let condition = Condition()
    private var queue: [StorageItem] = []
    private var stopping = false
    private var stopDeadline = 0.0
    private var stopped = false
    private var latestStats: JSON = .object(JSONObject())
    private var sharedBacklog = 0
    private var sharedFailing: String?
    private var sharedFailedAttempts = 0
    private var failedAttempts = 0
    /// The last mutation number stored.
    private var storedSeq = 0
    /// Set by the thread once a stop was asked for (flushes then ignore the backoff).
    private var draining = false
    /// Records not stored yet: the latest value per key (nil: delete).
    /// Key → the newest value (nil: delete) and the seq of its last change.
    private var pending: [String: (value: StoredValue?, changedAt: Int)] = [:]
    private var pendingSeq = 0
    /// A `clear` that has not reached the backend yet (it goes before `pending`).
    private var pendingClear: [(type: String, members: [String])]?
    /// The highest sequence number stored as reserved, and the one asked for.
    private(set) var reserved: Int
    private var wantReserved: Int
    private var loggedBadRecords: Set<String> = []
    /// The backend has no `scan`: said once.
    private var warnedNoScan = false

    /// The current failure episode.
    private struct Failure {
        var since: Double
        var attempts: Int
        var message: String
        var nextTry: Double
        var reportedBacklog: Int
    }
    private var failure: Failure?

    init(backend: Backend, idKey: String, maxDepth: Int, logger: Logger, seq: Int, reserved: Int, post: @escaping @Sendable (Event) -> Void) {
        self.storedSeq = seq
        self.backend = backend
        self.codec = RecordCodec(idKey: idKey, maxDepth: maxDepth)
        self.logger = logger
        self.post = post
        self.reserved = reserved
        self.wantReserved = reserved
        latestStats = backend.stats()
    }

    func start() {
        startThread(name: "concord-store") { [self] in self.run() }
    }

    func submit(_ items: [StorageItem]) {
        guard !items.isEmpty else { return }
        condition.lock()
        queue.append(contentsOf: items)
        condition.unlock()
        condition.broadcast()
    }

    /// The backend's figures as of its last batch, plus its name and the write-behind state.
    var stats: JSON {
        condition.lock()
        defer { condition.unlock() }
        var o = latestStats.objectValue ?? JSONObject()
        if o["backend"] == nil { o["backend"] = .string(backend.name) }
        o["library"] = .string(backend.path)
        o["backlog"] = .int(sharedBacklog)
        o["state"] = .string(sharedFailing == nil ? "ok" : "failing")
        o["failed_attempts"] = .int(sharedFailedAttempts)
        if let m = sharedFailing { o["last_error"] = .string(m) }
        return .object(o)
    }

    /// Records waiting to be stored.
    var backlog: Int {
        condition.lock()
        defer { condition.unlock() }
        return sharedBacklog
    }

    /// Stores everything queued (retrying a failing backend until `timeout`
    /// seconds have passed), closes the backend, and returns how many records
    /// could not be stored.
    func stop(timeout: Double) -> Int {
        condition.lock()
        stopping = true
        stopDeadline = monotonicSeconds() + timeout
        condition.broadcast()
        while !stopped { condition.wait() }
        let left = sharedBacklog
        condition.unlock()
        return left
    }

    private func run() {
        while true {
            condition.lock()
            while queue.isEmpty && !stopping {
                if let f = failure {
                    let wait = f.nextTry - monotonicSeconds()
                    if wait <= 0 { break }
                    condition.wait(seconds: wait)
                } else {
                    condition.wait()
                }
            }
            let items = queue
            queue = []
            let isStopping = stopping
            let deadline = stopDeadline
            condition.unlock()
            draining = isStopping
            process(items)
            if isStopping && items.isEmpty {
                // Final flush: retry a failing backend until the deadline.
                while failure != nil && monotonicSeconds() < deadline {
                    usleep(UInt32(min(max(failure!.nextTry - monotonicSeconds(), 0.01), 0.5) * 1e6))
                    flush()
                }
                if let f = failure {
                    logger.critical("records could not be stored before exit", metadata: [
                        "concord.records": "\(pending.count)", "concord.error": "\(f.message)",
                    ])
                } else {
                    // A clean stop keeps no reservation: a restart continues at seq + 1.
                    try? Self.writeReservation(backend, seq: storedSeq, upTo: storedSeq)
                }
                backend.close()
                condition.lock()
                sharedBacklog = pending.count + (pendingClear == nil ? 0 : 1)
                stopped = true
                condition.unlock()
                condition.broadcast()
                return
            }
            let s = backend.stats()
            condition.lock()
            latestStats = s
            condition.unlock()
        }
    }

    private func process(_ items: [StorageItem]) {
        for item in items {
            switch item {
            case .write(let seq, let writes):
                for w in writes { pending[w.key] = (w.value, w.changedAt) }
                pendingSeq = max(pendingSeq, seq)
            case .clear(let seq, let schema):
                pending = [:]
                pendingClear = schema
                pendingSeq = max(pendingSeq, seq)
            case .reserve(let upTo):
                wantReserved = max(wantReserved, upTo)
            case .load(let request):
                // Never read older than what the core wrote: flush first. If the
                // backend fails, the records written are still resident (they are
                // not evicted until stored), so what the load misses is not lost.
                flush()
                post(.loaded(load(request)))
            }
        }
        flush()
    }

    private func encode(_ v: StoredValue, changedAt: Int = 0) -> [UInt8] {
        switch v {
        case .entity(let value): return codec.encode(record: codec.normalize(value, includingRoot: false), changedAt: changedAt)
        case .document(let value): return codec.encode(record: codec.normalize(value, includingRoot: true), changedAt: changedAt)
        case .collection(let ids): return codec.encode(collection: ids, changedAt: changedAt)
        case .schema(let lists): return codec.encode(schema: lists)
        case .token(let seq): return codec.encode(token: seq)
        }
    }

    /// Writes what is pending as one atomic batch. On failure nothing is
    /// dropped: the records stay pending (newer writes replace them per key)
    /// and are retried with backoff; the failure is logged once per episode.
    private func flush() {
        let nothing = pendingSeq == 0 && pending.isEmpty && pendingClear == nil && wantReserved <= reserved
        guard !nothing else { return }
        if let f = failure, monotonicSeconds() < f.nextTry, !draining { publish(); return }
        let seq = max(pendingSeq, storedSeq)
        let reserve = max(wantReserved, reserved)
        do {
            if let schema = pendingClear {
                try backend.clear()
                if !schema.isEmpty { try backend.put(Array(RecordCodec.schemaKey.utf8), codec.encode(schema: schema)) }
                pendingClear = nil
            }
            var writes: [(key: [UInt8], value: [UInt8]?)] = []
            writes.reserveCapacity(pending.count + 1)
            for (key, p) in pending { writes.append((Array(key.utf8), p.value.map { encode($0, changedAt: p.changedAt) })) }
            // The last mutation number and the reservation travel with every batch.
            writes.append((Array(Self.seqKey.utf8), Array("{\"v\":1,\"seq\":\(seq),\"reserved\":\(reserve)}".utf8)))
            try backend.writeBatch(writes)
        } catch {
            noteFailure(error.description)
            return
        }
        let stored = pending.count
        pending = [:]
        pendingSeq = 0
        storedSeq = seq
        reserved = reserve
        if let f = failure {
            logger.notice("cache backend stores again", metadata: [
                "concord.failed_attempts": "\(f.attempts)",
                "concord.failing_seconds": "\(Int(monotonicSeconds() - f.since))",
                "concord.records": "\(stored)",
            ])
            failure = nil
        }
        publish()
        post(.committed(seq: seq, reserved: reserve))
    }

    private func noteFailure(_ message: String) {
        failedAttempts += 1
        let now = monotonicSeconds()
        let backlog = pending.count + (pendingClear == nil ? 0 : 1)
        if var f = failure {
            f.attempts += 1
            f.message = message
            f.nextTry = now + min(2.0, 0.05 * Double(1 << min(f.attempts, 6)))
            // Tell the core again only when the backlog doubled (it refuses writes over its limit).
            if backlog >= f.reportedBacklog * 2 {
                f.reportedBacklog = backlog
                post(.failing(message: message, backlog: backlog))
            }
            failure = f
        } else {
            logger.error("cache backend failed to store; keeping the records and retrying", metadata: [
                "concord.error": "\(message)", "concord.records": "\(backlog)",
            ])
            failure = Failure(since: now, attempts: 1, message: message, nextTry: now + 0.05, reportedBacklog: max(backlog, 1))
            post(.failing(message: message, backlog: backlog))
        }
        publish()
    }

    private func publish() {
        condition.lock()
        sharedBacklog = pending.count + (pendingClear == nil ? 0 : 1)
        sharedFailing = failure?.message
        sharedFailedAttempts = failedAttempts
        condition.unlock()
    }

    /// Reads the keys and, transitively, every entity they reference.
    private func load(_ request: LoadRequest) -> LoadResult {
        var result = LoadResult(ticket: request.ticket)
        var queue = request.keys
        var seen = Set(queue)
        var i = 0
        do {
            // Listed prefixes (every entity of a type): their records, then what they reference.
            for prefix in request.scanPrefixes {
                guard let records = try backend.scan(prefix: Array(prefix.utf8)) else {
                    if !warnedNoScan {
                        warnedNoScan = true
                        logger.warning("the cache backend cannot list records (no scan): live queries see only the entities in memory",
                                       metadata: ["concord.backend": "\(backend.name)"])
                    }
                    result.scanned.append(prefix)
                    continue
                }
                for (k, v) in records {
                    let key = String(decoding: k, as: UTF8.self)
                    guard seen.insert(key).inserted else { continue }
                    guard let (r, s) = codec.decodeRecordAndChange(v) else { badRecord(key); continue }
                    result.records[key] = .entity(r)
                    if s > 0 { result.changedAt[key] = s }
                    for id in codec.references(r, includingRoot: false) {
                        let ck = RecordCodec.entityKey(id)
                        if seen.insert(ck).inserted { queue.append(ck) }
                    }
                }
                result.scanned.append(prefix)
            }
            while i < queue.count {
                let key = queue[i]
                i += 1
                guard let (kind, _) = RecordCodec.parse(key: key) else { continue }
                guard let bytes = try backend.get(Array(key.utf8)) else {
                    result.absent.append(key)
                    continue
                }
                var refs: [String] = []
                switch kind {
                case .entity:
                    guard let (r, s) = codec.decodeRecordAndChange(bytes) else { badRecord(key); result.absent.append(key); continue }
                    result.records[key] = .entity(r)
                    if s > 0 { result.changedAt[key] = s }
                    refs = codec.references(r, includingRoot: false)
                case .document:
                    guard let (r, s) = codec.decodeRecordAndChange(bytes) else { badRecord(key); result.absent.append(key); continue }
                    result.records[key] = .document(r)
                    if s > 0 { result.changedAt[key] = s }
                    refs = codec.references(r, includingRoot: true)
                case .collection:
                    guard let (ids, s) = codec.decodeCollectionAndChange(bytes) else { badRecord(key); result.absent.append(key); continue }
                    result.records[key] = .collection(ids)
                    if s > 0 { result.changedAt[key] = s }
                    refs = ids
                case .schema:
                    continue
                case .token:
                    guard let s = codec.decodeToken(bytes) else { badRecord(key); result.absent.append(key); continue }
                    result.records[key] = .token(s)
                    continue
                }
                for id in refs {
                    let k = RecordCodec.entityKey(id)
                    if seen.insert(k).inserted { queue.append(k) }
                }
            }
        } catch {
            logger.error("cache backend failed to read", metadata: ["concord.error": "\(error)"])
            return LoadResult(ticket: request.ticket, error: error.description)
        }
        return result
    }

    /// A record that does not decode is a miss, logged once per key.
    private func badRecord(_ key: String) {
        guard loggedBadRecords.count < 10_000, loggedBadRecords.insert(key).inserted else { return }
        logger.warning("unreadable cache record treated as a miss", metadata: ["concord.record": "\(key)"])
    }

    static let seqKey = "s:seq"

    /// The last mutation number that may have been issued (0 when none):
    /// the stored reservation, read at start-up.
    static func readSeq(_ backend: Backend) -> Int {
        guard let bytes = try? backend.get(Array(seqKey.utf8)),
              let v = try? JSONParser().parse(bytes), v["v"]?.numberValue?.intValue == 1,
              let n = v["seq"]?.numberValue?.intValue, n >= 0
        else { return 0 }
        return max(n, v["reserved"]?.numberValue?.intValue ?? n)
    }

    /// Stores a reservation of sequence numbers up to `upTo` before serving
    /// (so a restart after a crash never reuses a number a client saw).
    static func writeReservation(_ backend: Backend, seq: Int, upTo: Int) throws(BackendError) {
        do {
            try backend.writeBatch([(Array(seqKey.utf8), Array("{\"v\":1,\"seq\":\(seq),\"reserved\":\(upTo)}".utf8))])
        } catch {
            throw BackendError(description: "cannot reserve sequence numbers in the cache backend: \(error)")
        }
    }

    /// Reads the schema at start-up (before the loop runs).
    static func readSchema(_ backend: Backend, idKey: String, logger: Logger) -> [(type: String, members: [String])]? {
        do {
            guard let bytes = try backend.get(Array(RecordCodec.schemaKey.utf8)) else { return nil }
            guard let schema = RecordCodec(idKey: idKey).decodeSchema(bytes) else {
                logger.warning("unreadable schema record in the cache; starting without a schema")
                return nil
            }
            return schema
        } catch {
            logger.error("cannot read the schema from the cache backend", metadata: ["concord.error": "\(error)"])
            return nil
        }
    }
}
