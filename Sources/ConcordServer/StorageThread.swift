import ConcordCore
import ConcordJSON
import Logging

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
    // Sendable: `queue`, `stopping`, `stopped`, `latestStats` are guarded by
    // `condition`; `backend`, `pending*`, `loggedBadRecords` belong to the thread.
    enum Event {
        case committed(Int)
        case failed(Int, String)
        case loaded(LoadResult)
    }

    private let backend: Backend
    private let codec: RecordCodec
    private let logger: Logger
    private let post: @Sendable (Event) -> Void
    private let condition = Condition()
    private var queue: [StorageItem] = []
    private var stopping = false
    private var stopped = false
    private var latestStats: JSON = .object(JSONObject())
    private var pending: [String: StoredValue?] = [:]
    private var pendingSeq = 0
    private var loggedBadRecords: Set<String> = []

    init(backend: Backend, idKey: String, logger: Logger, post: @escaping @Sendable (Event) -> Void) {
        self.backend = backend
        self.codec = RecordCodec(idKey: idKey)
        self.logger = logger
        self.post = post
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

    /// The backend's figures as of its last batch, plus its name.
    var stats: JSON {
        condition.lock()
        defer { condition.unlock() }
        var o = latestStats.objectValue ?? JSONObject()
        if o["backend"] == nil { o["backend"] = .string(backend.name) }
        o["library"] = .string(backend.path)
        return .object(o)
    }

    /// Applies everything queued, closes the backend, and returns.
    func stop() {
        condition.lock()
        stopping = true
        condition.broadcast()
        while !stopped { condition.wait() }
        condition.unlock()
    }

    private func run() {
        while true {
            condition.lock()
            while queue.isEmpty && !stopping { condition.wait() }
            let items = queue
            queue = []
            let finish = stopping && items.isEmpty
            condition.unlock()
            if finish {
                backend.close()
                condition.lock()
                stopped = true
                condition.unlock()
                condition.broadcast()
                return
            }
            process(items)
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
                for w in writes { pending[w.key] = .some(w.value) }
                pendingSeq = max(pendingSeq, seq)
            case .clear(let seq, let schema):
                pending = [:]
                do {
                    try backend.clear()
                    if !schema.isEmpty { try backend.put(Array(RecordCodec.schemaKey.utf8), codec.encode(schema: schema)) }
                    pendingSeq = max(pendingSeq, seq)
                } catch {
                    logger.error("cache backend failed to clear", metadata: ["concord.error": "\(error)"])
                    post(.failed(seq, error.description))
                }
            case .load(let request):
                flush()
                post(.loaded(load(request)))
            }
        }
        flush()
    }

    private func encode(_ v: StoredValue) -> [UInt8] {
        switch v {
        case .entity(let value): return codec.encode(record: codec.normalize(value, includingRoot: false))
        case .document(let value): return codec.encode(record: codec.normalize(value, includingRoot: true))
        case .collection(let ids): return codec.encode(collection: ids)
        case .schema(let lists): return codec.encode(schema: lists)
        }
    }

    private func flush() {
        guard pendingSeq > 0 || !pending.isEmpty else { return }
        let seq = pendingSeq
        var writes: [(key: [UInt8], value: [UInt8]?)] = []
        writes.reserveCapacity(pending.count)
        for (key, value) in pending { writes.append((Array(key.utf8), value.map(encode))) }
        // The last mutation number travels with every batch, so a restart continues the numbering.
        writes.append((Array(Self.seqKey.utf8), Array("{\"v\":1,\"seq\":\(seq)}".utf8)))
        pending = [:]
        pendingSeq = 0
        do {
            try backend.writeBatch(writes)
            post(.committed(seq))
        } catch {
            logger.error("cache backend failed to write", metadata: [
                "concord.error": "\(error)", "concord.records": "\(writes.count)", "concord.seq": "\(seq)",
            ])
            post(.failed(seq, error.description))
        }
    }

    /// Reads the keys and, transitively, every entity they reference.
    private func load(_ request: LoadRequest) -> LoadResult {
        var result = LoadResult(ticket: request.ticket)
        var queue = request.keys
        var seen = Set(queue)
        var i = 0
        do {
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
                    guard let r = codec.decodeRecord(bytes) else { badRecord(key); result.absent.append(key); continue }
                    result.records[key] = .entity(r)
                    refs = codec.references(r, includingRoot: false)
                case .document:
                    guard let r = codec.decodeRecord(bytes) else { badRecord(key); result.absent.append(key); continue }
                    result.records[key] = .document(r)
                    refs = codec.references(r, includingRoot: true)
                case .collection:
                    guard let ids = codec.decodeCollection(bytes) else { badRecord(key); result.absent.append(key); continue }
                    result.records[key] = .collection(ids)
                    refs = ids
                case .schema:
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

    /// The last mutation number stored (0 when none), read at start-up.
    static func readSeq(_ backend: Backend) -> Int {
        guard let bytes = try? backend.get(Array(seqKey.utf8)),
              let v = try? JSONParser().parse(bytes), v["v"]?.numberValue?.intValue == 1,
              let n = v["seq"]?.numberValue?.intValue, n >= 0
        else { return 0 }
        return n
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
