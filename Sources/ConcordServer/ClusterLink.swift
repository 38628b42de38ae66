import CConcordRedis
import CHiredis
import CLibUV
import ConcordCore
import Logging
import Synchronization

/// What the server needs of a cluster log, on the loop thread. The core
/// (``Engine`` in cluster mode) knows only entries in and appends out; a log
/// engine is one implementation of this (Redis Streams: ``ClusterLink``), so
/// another (PostgreSQL, etcd: a log that does not lose acknowledged writes on
/// failover) plugs in here and runs the same core and cluster tests.
protocol ClusterLogLink: AnyObject {
    /// Connects, and keeps trying; posts `.cluster(...)` events and entries to the sequencer.
    func start()
    /// At shutdown, once the core drained.
    func close()
    /// One sequencer turn's mutations, in order (one host's appends must be applied in this order).
    func append(_ mutations: [(ref: Int, line: [UInt8])])
    /// `sync`: post `.cluster(.head(n))`.
    func fetchHead()
    /// A snapshot every host took at the same offset: publish its digest, store it if this host is elected.
    func snapshotTaken(_ bytes: [UInt8], offset: Int, streamID: String, sum: String)
    /// The core stopped following the log: post `.resyncSnapshot` with what the log holds now, then entries after it.
    func resync()
}

#if canImport(Glibc)
import Glibc
#endif

/// Cluster mode's link to the shared log, a Redis Stream (PROTOCOL.md §8,
/// docs/ARCHITECTURE.md "Cluster mode"). Lives on the loop thread: two
/// hiredis connections on the server's own libuv loop — the **writer**
/// (appends through one Lua script, heartbeat, head) and the **reader**
/// (`XREAD BLOCK`, every entry in order). hiredis has no timers: every
/// deadline (connect, heartbeat, a blocked read) is a libuv timer here.
///
/// What the core learns goes to the sequencer's inbox: entries, and
/// attached/detached/head/append-failed events.
final class ClusterLink: ClusterLogLink {
    enum Endpoint: Equatable {
        case tcp(host: String, port: Int32)
        case unix(path: String)

        /// `redis://HOST:PORT` or `unix:///path/to/redis.sock`.
        static func parse(_ url: String) -> Endpoint? {
            if url.hasPrefix("unix://") {
                let path = String(url.dropFirst("unix://".count))
                return path.hasPrefix("/") ? .unix(path: path) : nil
            }
            guard url.hasPrefix("redis://") else { return nil }
            var rest = Substring(url.dropFirst("redis://".count))
            if rest.hasSuffix("/") { rest = rest.dropLast() }
            var host: Substring
            var port: Substring
            if rest.hasPrefix("[") {
                guard let close = rest.firstIndex(of: "]") else { return nil }
                host = rest[rest.index(after: rest.startIndex)..<close]
                let after = rest[rest.index(after: close)...]
                port = after.hasPrefix(":") ? after.dropFirst() : "6379"
            } else if let colon = rest.lastIndex(of: ":") {
                host = rest[..<colon]
                port = rest[rest.index(after: colon)...]
            } else {
                host = rest
                port = "6379"
            }
            guard !host.isEmpty, let p = Int32(port), p > 0, p < 65536 else { return nil }
            return .tcp(host: String(host), port: p)
        }
    }

    /// Everything the link needs to know, fixed at start-up.
    struct Options {
        var endpoint: Endpoint
        var settings: ClusterSettings
        /// Outcome-changing options of this host; the log refuses a host whose differ.
        var engineVersion: String
        var optionsFingerprint: String
        /// Mutations per log entry, at most.
        var maxEntryMutations = 256
        /// Payload bytes per entry, at most (one mutation alone may exceed it).
        var maxEntryBytes = 1 << 20
        /// Seconds: the timer's period (a heartbeat goes out on each tick when
        /// none is in flight), and how long without a heartbeat answer the log
        /// counts as lost — detection within lossAfter + heartbeat < 1 s of a cut.
        var heartbeat = 0.125
        var lossAfter = 0.75
        /// `XREAD BLOCK` milliseconds.
        var blockMs = 500
        /// Entries read and not yet applied above which the reader pauses (flow control).
        var maxQueuedEntries = 1024
        /// Every host snapshots its state at each multiple of this offset (its
        /// checksum is the state digest hosts compare); one of them uploads it.
        /// 0: never (no digests, and the log is never trimmed).
        var snapshotEvery = 10_000
        /// Bytes per snapshot chunk (one Redis string each).
        var snapshotChunkBytes = 512 << 10
    }

    /// One append: the mutations of one window, under one entry token (the
    /// script stores the token, so a retry after a lost answer is not appended twice).
    private struct Append {
        var token: String
        var refs: [Int]
        var payload: [UInt8]
        var firstQueued: Double
        var sent = false
        /// An answer to it was lost (the connection went after it was
        /// sent): that attempt may have gone in, so a later refusal does
        /// not mean nothing was applied.
        var answerLost = false
    }

    private enum Role: String {
        case writer, reader
        case uploader = "snapshot uploader"
    }

    private final class Conn {
        let role: Role
        var ac: UnsafeMutablePointer<redisAsyncContext>?
        var connected = false { didSet { if connected { connectedAt = monotonicSeconds() } } }
        var connectedAt = 0.0
        let openedAt: Double
        init(role: Role, ac: UnsafeMutablePointer<redisAsyncContext>, openedAt: Double) {
            self.role = role
            self.ac = ac
            self.openedAt = openedAt
        }
    }

    /// What a command's callback runs (retained until hiredis calls back, exactly once).
    private final class ReplyBox {
        let run: (UnsafeMutablePointer<redisReply>?) -> Void
        init(_ run: @escaping (UnsafeMutablePointer<redisReply>?) -> Void) { self.run = run }
    }

    let options: Options
    private let loop: UnsafeMutablePointer<uv_loop_t>
    private let logger: Logger
    private let sequencer: Sequencer

    private let metaKey: String
    private let logKey: String
    private let tokenPrefix: String

    private var writer: Conn?
    /// A snapshot being stored, on its own connection (opened for it, dropped after).
    private var uploader: Conn?
    private var upload: (bytes: [UInt8], offset: Int, streamID: String, sum: String)?
    private var reader: Conn?
    private var scriptSHA: String?
    private var scriptLoading = false
    private var beatSentAt: Double?
    private var lastBeat = 0.0
    private var told: (attached: Bool, epoch: String, head: Int) = (false, "", -1)
    private var lastID = "0-0"
    /// The log's start was looked at (snapshot loaded if the log is trimmed); the reader waits for it.
    private var bootstrapped = false
    private var bootstrapping = false
    /// This host's own copy of the state (ClusterLocalCopy), until bootstrap decided whether it still fits the log.
    var localCopy: ClusterLocalCopy.Stored?
    /// Rebuilding: the log's truth is being fetched (no reads meanwhile);
    /// reads of an older generation are dropped; a rebuild to retry once connected.
    private var resyncing = false
    private var readGeneration = 0
    private var resyncAgain = false
    /// The newest snapshot's offset (from the heartbeat).
    private var snapshotOffset = 0
    private(set) var snapshotsWritten = 0
    /// The highest offset read, and its value when the heartbeat in flight was sent.
    private var readOffset = 0
    private var readOffsetAtBeat = 0
    private var readSentAt: Double?
    /// Since when reads have been refused (an error answer, not a lost
    /// connection), and the last refusal; nil once one passes. Kept across
    /// reconnections: a host whose reads are refused cannot follow the
    /// order, so it detaches and does not attach again before one passes.
    private var readRefused: (since: Double, error: String)?
    /// A `sync`'s head read was refused: asked again on the next tick.
    private var headAgain = false
    private var queue: [Append] = []
    private var inFlight: [String: Append] = [:]
    private var nextToken = 0
    private let nonce: String
    private var timer: UnsafeMutablePointer<uv_timer_t>?
    private var closed = false
    private var lastProblem = ""
    /// Figures for `stats` and logs.
    private(set) var appendsSent = 0
    private(set) var entriesRead = 0
    private(set) var reconnects = 0

    init(options: Options, loop: UnsafeMutablePointer<uv_loop_t>, logger: Logger, sequencer: Sequencer) {
        self.options = options
        self.loop = loop
        self.logger = logger
        self.sequencer = sequencer
        let n = options.settings.name
        metaKey = "concord:{\(n)}:meta"
        logKey = "concord:{\(n)}:log"
        tokenPrefix = "concord:{\(n)}:tok:"
        var r = SystemRandomNumberGenerator()
        nonce = String(r.next(), radix: 16)
    }

    private func submit(_ input: Sequencer.Input) { sequencer.submit(input) }

    // MARK: Life cycle

    func start() {
        let t = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
        uvMust("uv_timer_init", uv_timer_init(loop, t))
        uv_handle_set_data(asHandle(t), Unmanaged.passUnretained(self).toOpaque())
        let period = UInt64(options.heartbeat * 1000)
        uvMust("uv_timer_start", uv_timer_start(t, { h in
            Unmanaged<ClusterLink>.fromOpaque(uv_handle_get_data(asHandle(h!))!).takeUnretainedValue().tick()
        }, 0, period))
        timer = t
    }

    /// At shutdown, after the core drained: both connections and the timer go.
    func close() {
        guard !closed else { return }
        closed = true
        if let t = timer {
            uvMust("uv_timer_stop", uv_timer_stop(t))
            uv_close(asHandle(t)) { h in h?.deallocate() }
            timer = nil
        }
        drop(&writer, reason: "shutdown")
        drop(&reader, reason: "shutdown")
        drop(&uploader, reason: "shutdown")
    }

    // MARK: Connections

    private func open(_ role: Role) -> Conn? {
        let ac: UnsafeMutablePointer<redisAsyncContext>?
        switch options.endpoint {
        case .tcp(let host, let port): ac = redisAsyncConnect(host, port)
        case .unix(let path): ac = redisAsyncConnectUnix(path)
        }
        guard let ac else { return nil }
        if ac.pointee.err != 0 {
            problem("cannot connect the \(role.rawValue) to the cluster log: \(String(cString: ac.pointee.errstr))")
            redisAsyncFree(ac)
            return nil
        }
        ac.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        guard concord_redis_attach(ac, loop) == 0 else {
            redisAsyncFree(ac)
            return nil
        }
        redisAsyncSetConnectCallback(ac) { ac, status in
            guard let ac, let data = ac.pointee.data else { return }
            Unmanaged<ClusterLink>.fromOpaque(data).takeUnretainedValue().connected(UnsafeMutablePointer(mutating: ac), ok: status == 0)
        }
        redisAsyncSetDisconnectCallback(ac) { ac, status in
            guard let ac, let data = ac.pointee.data else { return }
            Unmanaged<ClusterLink>.fromOpaque(data).takeUnretainedValue().disconnected(UnsafeMutablePointer(mutating: ac))
        }
        return Conn(role: role, ac: ac, openedAt: monotonicSeconds())
    }

    private func connected(_ ac: UnsafeMutablePointer<redisAsyncContext>, ok: Bool) {
        let conn = writer?.ac == ac ? writer : reader?.ac == ac ? reader : uploader?.ac == ac ? uploader : nil
        guard let conn else { return }
        if !ok {
            // hiredis frees the context after this callback.
            problem("cannot connect the \(conn.role.rawValue) to the cluster log: \(String(cString: ac.pointee.errstr))")
            conn.ac = nil
            if conn === writer { writer = nil } else if conn === reader { reader = nil } else { uploader = nil; upload = nil }
            return
        }
        conn.connected = true
        if conn === uploader {
            startUpload()
        } else if conn === writer {
            loadScript()
            heartbeat()
            if !bootstrapped { bootstrap() }
        } else {
            read()
        }
    }

    private func disconnected(_ ac: UnsafeMutablePointer<redisAsyncContext>) {
        // hiredis frees the context after this callback; pending commands were answered with no reply.
        if writer?.ac == ac {
            writer?.ac = nil
            writer = nil
            lost("the cluster log closed the writer connection")
        } else if reader?.ac == ac {
            reader?.ac = nil
            reader = nil
            lost("the cluster log closed the reader connection")
        } else if uploader?.ac == ac {
            uploader?.ac = nil
            uploader = nil
            upload = nil  // the lease expires; the next snapshot point tries again
        }
    }

    /// Frees a connection now (never from inside one of its own callbacks:
    /// only the timer and `close` call this).
    private func drop(_ conn: inout Conn?, reason: String, isLoss: Bool = true) {
        guard let c = conn else { return }
        conn = nil
        if let ac = c.ac {
            c.ac = nil
            ac.pointee.data = nil  // its disconnect callback must not find us
            redisAsyncFree(ac)  // answers its pending commands with no reply
        }
        switch c.role {
        case .reader: readSentAt = nil
        case .writer:
            beatSentAt = nil
            scriptSHA = nil
            scriptLoading = false
        case .uploader: break
        }
        if reason != "shutdown" && isLoss { lost(reason) }
    }

    private func lost(_ reason: String) {
        beatSentAt = nil
        readSentAt = nil
        if told.attached {
            told.attached = false
            logger.warning("detached from the cluster log", metadata: ["concord.reason": "\(reason)"])
            submit(.cluster(.detached(reason: reason)))
        }
        scriptSHA = nil
        scriptLoading = false
    }

    private func problem(_ message: String) {
        if message != lastProblem {
            lastProblem = message
            logger.warning("\(message)")
        }
    }

    // MARK: The timer: connects, heartbeats, deadlines

    private func tick() {
        guard !closed else { return }
        let now = monotonicSeconds()
        if let w = writer, !w.connected, now - w.openedAt > options.lossAfter { drop(&writer, reason: "connecting the writer took over \(options.lossAfter) s") }
        if let r = reader, !r.connected, now - r.openedAt > options.lossAfter { drop(&reader, reason: "connecting the reader took over \(options.lossAfter) s") }
        // Either connection's deadline drops both: they share the path to the
        // log, and a reader left over from before a cut could hold a read the
        // network lost (TCP retransmitting with back-off) while the new writer
        // already says "attached" — its reads would come seconds late.
        if beatSentAt != nil, let w = writer, w.connected, now - max(lastBeat, w.connectedAt) > options.lossAfter {
            drop(&writer, reason: "no heartbeat answer from the cluster log within \(options.lossAfter) s")
            drop(&reader, reason: "the writer lost the cluster log", isLoss: false)
        }
        if let r = readRefused, told.attached, now - r.since > options.lossAfter {
            drop(&reader, reason: "the cluster log refused reads for over \(options.lossAfter) s: \(r.error)")
            drop(&writer, reason: "the reader lost the cluster log", isLoss: false)
        }
        if let sent = readSentAt, now - sent > Double(options.blockMs) / 1000 + options.lossAfter {
            drop(&reader, reason: "a blocked read of the cluster log did not return within \(Double(options.blockMs) / 1000 + options.lossAfter) s")
            drop(&writer, reason: "the reader lost the cluster log", isLoss: false)
        }
        // The snapshot upload's own connection: gone when done, or when it cannot connect.
        if let u = uploader, upload == nil || (!u.connected && now - u.openedAt > options.lossAfter) {
            drop(&uploader, reason: "upload finished", isLoss: false)
            upload = nil
        }
        if writer == nil {
            if told.attached || lastBeat > 0 { reconnects += 1 }
            writer = open(.writer)
        }
        if reader == nil { reader = open(.reader) }
        if writer?.connected == true, beatSentAt == nil { heartbeat() }
        // The append script again when it was refused: Redis answers
        // `-LOADING` while it reads its files after a restart, and the
        // heartbeats may pass (attached) a moment later. Appends wait for
        // the script; without this they waited out the cluster timeout.
        if writer?.connected == true, scriptSHA == nil { loadScript() }
        if writer?.connected == true, !bootstrapped { bootstrap() }
        if writer?.connected == true, resyncAgain {
            resyncAgain = false
            resync()
        }
        if reader?.connected == true, readSentAt == nil { read() }
        if headAgain { fetchHead() }
        expireAppends(now: now)
    }

    private func heartbeat() {
        guard let ac = writer?.ac, writer?.connected == true, beatSentAt == nil else { return }
        beatSentAt = monotonicSeconds()
        readOffsetAtBeat = readOffset
        command(ac, ["HMGET", metaKey, "epoch", "offset", "snap1_offset"]) { [self] reply in
            guard let reply, reply.pointee.type == REDIS_REPLY_ARRAY, reply.pointee.elements == 3 else {
                if let reply {
                    // An answer that is not the log's state (`-LOADING` for
                    // seconds after a restart with a large AOF) is no
                    // answer: the beat stays outstanding, so the loss
                    // deadline runs from the last good one and the host
                    // detaches (it stayed attached while every append was
                    // refused), reconnecting until the heartbeats pass.
                    problem("unexpected heartbeat answer from the cluster log: \(Self.text(reply) ?? "?")")
                } else {
                    beatSentAt = nil
                }
                return
            }
            beatSentAt = nil
            lastBeat = monotonicSeconds()
            let epoch = Self.text(reply.pointee.element[0]!) ?? ""
            let head = Int(Self.text(reply.pointee.element[1]!) ?? "0") ?? 0
            snapshotOffset = Int(Self.text(reply.pointee.element[2]!) ?? "0") ?? 0
            // A head below what was read before asking: the log lost entries
            // (a head below what was read *after* asking is only a late answer).
            let rolledBack = head < readOffsetAtBeat && (epoch == told.epoch || epoch.isEmpty)
            if rolledBack {
                logger.critical("the cluster log's head went back", metadata: ["concord.head": "\(head)", "concord.read": "\(readOffsetAtBeat)"])
                submit(.cluster(.attached(epoch: epoch, head: head, rolledBack: true)))
            }
            // Not before the start-up decision (local copy, snapshot, or the
            // log from its start) is made and handed to the core: an empty
            // state is not "a few entries behind" a trimmed log, and the host
            // must not count as caught up (and listen) on it.
            if bootstrapped, reader?.connected == true, readRefused == nil, !told.attached || told.epoch != epoch || told.head != head {
                if !told.attached {
                    logger.info("attached to the cluster log", metadata: [
                        "concord.cluster": "\(options.settings.name)", "concord.epoch": "\(epoch)", "concord.head": "\(head)",
                    ])
                    lastProblem = ""
                }
                told = (true, epoch, head)
                submit(.cluster(.attached(epoch: epoch, head: head)))
            }
            flush()
        }
    }

    /// `sync`: the log's head offset, for the core. Refused (`-LOADING`),
    /// it is asked again on the next tick: the core asks once per wait, and
    /// heartbeats ask again only when the head moves. (A lost connection
    /// needs no retry: attaching again makes the core ask.)
    func fetchHead() {
        guard let ac = writer?.ac, writer?.connected == true else { return }
        headAgain = false
        command(ac, ["HGET", metaKey, "offset"]) { [self] reply in
            guard let reply else { return }
            guard reply.pointee.type != REDIS_REPLY_ERROR else {
                problem("reading the cluster log's head failed: \(Self.text(reply) ?? "?")")
                headAgain = true
                return
            }
            submit(.cluster(.head(Int(Self.text(reply) ?? "0") ?? 0)))
        }
    }

    // MARK: Reading the log

    private func read() {
        guard bootstrapped, !resyncing, let ac = reader?.ac, reader?.connected == true, readSentAt == nil, !closed else { return }
        guard sequencer.clusterQueued.load(ordering: .relaxed) < options.maxQueuedEntries else { return }  // the timer asks again
        readSentAt = monotonicSeconds()
        let generation = readGeneration
        command(ac, ["XREAD", "COUNT", "256", "BLOCK", String(options.blockMs), "STREAMS", logKey, lastID]) { [self] reply in
            guard generation == readGeneration else { return }  // sent before a rebuild moved the read position
            readSentAt = nil
            guard let reply else { return }  // disconnected: the timer reconnects
            if reply.pointee.type == REDIS_REPLY_ERROR {
                // Refused (`-NOPERM`, `-LOADING`): the timer asks again on
                // its next tick, and detaches the host if this lasts.
                let error = Self.text(reply) ?? "?"
                problem("reading the cluster log failed: \(error)")
                readRefused = (readRefused?.since ?? monotonicSeconds(), error)
                return
            }
            readRefused = nil
            if reply.pointee.type == REDIS_REPLY_ARRAY {
                let entries = parseEntries(reply)
                if !entries.isEmpty {
                    entriesRead += entries.count
                    sequencer.clusterQueued.add(entries.count, ordering: .relaxed)
                    submit(.clusterEntries(entries))
                }
            }
            read()
        }
    }

    /// `[[key, [[id, [field, value, …]], …]]]` → entries; `lastID` moves past them.
    private func parseEntries(_ reply: UnsafeMutablePointer<redisReply>) -> [ClusterEntry] {
        var out: [ClusterEntry] = []
        for s in 0..<reply.pointee.elements {
            let stream = reply.pointee.element[s]!
            guard stream.pointee.type == REDIS_REPLY_ARRAY, stream.pointee.elements == 2 else { continue }
            let items = stream.pointee.element[1]!
            for i in 0..<items.pointee.elements {
                let item = items.pointee.element[i]!
                guard item.pointee.elements == 2, let id = Self.text(item.pointee.element[0]!) else { continue }
                lastID = id
                let f = Self.fields(item.pointee.element[1]!)
                guard let o = f["o"].flatMap(Self.text).flatMap({ Int($0) }), let p = f["p"].flatMap(Self.text),
                      let h = f["h"].flatMap(Self.text), let e = f["e"].flatMap(Self.text),
                      let t = Double(id.prefix(while: { $0 != "-" })), let g = f["g"].flatMap(Self.text),
                      let m = f["m"].flatMap(Self.bytes), let muts = ClusterEntry.decode(m) else {
                    logger.error("a cluster log entry is malformed; the hosts stop at it", metadata: ["concord.entry": "\(id)"])
                    // An entry every host reads alike: passed on with no mutations but a broken chain, so each stops.
                    out.append(ClusterEntry(offset: Int.max, previousHash: "", hash: "", epoch: "", time: 0, origin: "", mutations: []))
                    continue
                }
                readOffset = max(readOffset, o)
                out.append(ClusterEntry(offset: o, previousHash: p, hash: h, epoch: e, time: t / 1000, origin: g, mutations: muts, streamID: id))
            }
        }
        return out
    }

    // MARK: Snapshots: joining, writing, trimming

    /// What the log holds now, to start or rebuild from.
    enum Truth {
        /// The log starts at offset 1: replay it from its start.
        case fromStart
        /// The newest intact snapshot, and where the log goes on after it.
        case snapshot(bytes: [UInt8], streamID: String, offset: Int)
        /// Trimmed, and no snapshot that checks out.
        case unusable(String)
    }

    /// Once per process, before the first read: a log that no longer starts
    /// at offset 1 was trimmed below a snapshot — load the newest snapshot and
    /// read on after it; otherwise replay the log from its start.
    private func bootstrap() {
        guard !bootstrapping, !bootstrapped else { return }
        bootstrapping = true
        guard let local = localCopy else { return bootstrapFromLog() }
        checkLocalCopy(local) { [self] usable, why in
            guard let usable else {
                bootstrapping = false  // connection lost: the timer tries again
                return
            }
            localCopy = nil
            guard usable else {
                logger.warning("the local copy does not fit the cluster log; joining from the log", metadata: [
                    "concord.local_offset": "\(local.offset)", "concord.reason": "\(why)",
                ])
                return bootstrapFromLog()
            }
            logger.info("resuming from the local copy", metadata: ["concord.offset": "\(local.offset)", "concord.seq": "\(local.seq)"])
            bootstrapping = false
            bootstrapped = true
            submit(.loadSnapshot(local.bytes))
            lastID = local.streamID
            readOffset = local.offset
            read()
        }
    }

    /// Whether the log still holds what follows the local copy: the same
    /// epoch, and either the head is the copy's offset with its chain hash,
    /// or the entry after it (by stream id) is offset + 1 and continues the
    /// chain from the copy's hash. nil: the connection went (ask again).
    private func checkLocalCopy(_ local: ClusterLocalCopy.Stored, _ done: @escaping (Bool?, String) -> Void) {
        guard let ac = writer?.ac, writer?.connected == true else { return done(nil, "") }
        command(ac, ["HMGET", metaKey, "epoch", "offset", "h"]) { [self] reply in
            guard let reply, reply.pointee.type == REDIS_REPLY_ARRAY, reply.pointee.elements == 3 else { return done(nil, "") }
            let epoch = Self.text(reply.pointee.element[0]!) ?? ""
            let head = Int(Self.text(reply.pointee.element[1]!) ?? "0") ?? 0
            let h = Self.text(reply.pointee.element[2]!) ?? ""
            guard epoch == local.epoch else { return done(false, "the log's epoch is '\(epoch)', the copy's '\(local.epoch)' (the log was recreated)") }
            guard head >= local.offset else { return done(false, "the log's head (\(head)) is below the copy's offset (the log lost entries)") }
            if head == local.offset { return done(h == local.hash, h == local.hash ? "" : "the log's chain hash at its head differs from the copy's") }
            guard let w = writer?.ac else { return done(nil, "") }
            command(w, ["XRANGE", logKey, "(" + local.streamID, "+", "COUNT", "1"]) { next in
                guard let next, next.pointee.type == REDIS_REPLY_ARRAY else { return done(nil, "") }
                guard next.pointee.elements == 1 else { return done(false, "the log holds nothing after the copy's stream id") }
                let f = Self.fields(next.pointee.element[0]!.pointee.element[1]!)
                guard f["o"].flatMap(Self.text).flatMap({ Int($0) }) == local.offset + 1 else {
                    return done(false, "the log no longer holds offset \(local.offset + 1) (trimmed below a newer snapshot)")
                }
                let continues = f["p"].flatMap(Self.text) == local.hash
                done(continues, continues ? "" : "the entry after the copy does not continue its chain hash")
            }
        }
    }

    private func bootstrapFromLog() {
        findTruth { [self] truth in
            bootstrapping = false
            guard let truth else { return }  // connection lost: the timer tries again
            bootstrapped = true
            switch truth {
            case .fromStart: break
            case .snapshot(let bytes, let id, let offset):
                submit(.loadSnapshot(bytes))
                lastID = id
                readOffset = offset
            case .unusable(let why):
                submit(.cluster(.broken(reason: why)))
                return
            }
            read()
        }
    }

    /// The core stopped following the log (it lost entries): fetch what the
    /// log holds now for the core to rebuild from, and read on from there.
    /// Reads sent before are dropped (their generation is past).
    func resync() {
        guard !resyncing else { return }
        resyncing = true
        readGeneration += 1
        readSentAt = nil
        findTruth { [self] truth in
            guard let truth else {
                // Connection lost: try again once connected (the core asks only once).
                resyncing = false
                resyncAgain = true
                return
            }
            resyncing = false
            switch truth {
            case .fromStart:
                lastID = "0-0"
                readOffset = 0
                submit(.resyncSnapshot(nil))
            case .snapshot(let bytes, let id, let offset):
                lastID = id
                readOffset = offset
                submit(.resyncSnapshot(bytes))
            case .unusable(let why):
                submit(.cluster(.broken(reason: why)))
                return
            }
            logger.warning("the cluster log lost entries: rebuilding this host from what it holds", metadata: ["concord.from_offset": "\(readOffset)"])
            read()
        }
    }

    /// How many times the log's meta is read when no snapshot it names
    /// checks out: two uploads between reading the meta and reading the
    /// chunks replace both snapshots it named (their chunks are deleted),
    /// which is not damage — a fresh look names the new ones. Damage stays
    /// damage on every look.
    static let truthLooks = 3

    private func findTruth(look: Int = 1, _ done: @escaping (Truth?) -> Void) {
        guard let ac = writer?.ac, writer?.connected == true else { return done(nil) }
        command(ac, ["XRANGE", logKey, "-", "+", "COUNT", "1"]) { [self] reply in
            guard let reply, reply.pointee.type == REDIS_REPLY_ARRAY else { return done(nil) }
            var firstOffset: Int?
            if reply.pointee.elements > 0 {
                firstOffset = Self.fields(reply.pointee.element[0]!.pointee.element[1]!)["o"].flatMap(Self.text).flatMap { Int($0) }
            }
            guard let w = writer?.ac else { return done(nil) }
            command(w, ["HMGET", metaKey, "offset", "snap1_offset", "snap1_id", "snap1_chunks", "snap1_len", "snap1_sum",
                        "snap2_offset", "snap2_id", "snap2_chunks", "snap2_len", "snap2_sum"]) { [self] meta in
                guard let meta, meta.pointee.type == REDIS_REPLY_ARRAY, meta.pointee.elements == 11 else { return done(nil) }
                let f = (0..<11).map { Self.text(meta.pointee.element[$0]!) }
                let head = Int(f[0] ?? "0") ?? 0
                let trimmed = firstOffset.map { $0 > 1 } ?? (head > 0)
                guard trimmed else { return done(.fromStart) }
                let candidates = [Array(f[1...5]), Array(f[6...10])].compactMap { m -> (offset: Int, id: String, chunks: Int, length: Int, sum: String)? in
                    guard let o = m[0].flatMap({ Int($0) }), let id = m[1], let c = m[2].flatMap({ Int($0) }),
                          let l = m[3].flatMap({ Int($0) }), let sum = m[4] else { return nil }
                    return (o, id, c, l, sum)
                }
                fetchSnapshot(candidates[...]) { [self] truth in
                    guard case .unusable = truth, look < Self.truthLooks else { return done(truth) }
                    logger.warning("no snapshot the cluster log names checked out: reading its meta again (snapshots replaced while they were read are not damaged)",
                                   metadata: ["concord.look": "\(look + 1)"])
                    findTruth(look: look + 1, done)
                }
            }
        }
    }

    /// Fetches the first candidate whose bytes check out; the next one when they do not.
    private func fetchSnapshot(_ candidates: ArraySlice<(offset: Int, id: String, chunks: Int, length: Int, sum: String)>,
                               _ done: @escaping (Truth?) -> Void) {
        guard let c = candidates.first else {
            return done(.unusable("the cluster log was trimmed and no usable snapshot is stored; this host cannot rebuild the state"))
        }
        guard let ac = writer?.ac else { return done(nil) }
        let keys = (0..<c.chunks).map { "\(tokenPrefix.dropLast(4))snap:\(c.offset):\($0)" }
        command(ac, ["MGET"] + keys) { [self] reply in
            guard let reply, reply.pointee.type == REDIS_REPLY_ARRAY else { return done(nil) }
            var bytes: [UInt8] = []
            bytes.reserveCapacity(c.length)
            for i in 0..<reply.pointee.elements {
                if let b = Self.bytes(reply.pointee.element[i]!) { bytes.append(contentsOf: b) }
            }
            guard bytes.count == c.length, Self.fnvHex(bytes) == c.sum else {
                logger.error("a cluster snapshot is damaged; trying the older one", metadata: ["concord.offset": "\(c.offset)"])
                fetchSnapshot(candidates.dropFirst(), done)
                return
            }
            done(.snapshot(bytes: bytes, streamID: c.id, offset: c.offset))
        }
    }

    /// A snapshot every host took at the same offset (a multiple of
    /// `snapshotEvery`): its checksum is published as this host's state
    /// digest and compared with the other hosts' (a mismatch is an alarm,
    /// never silent); the host that gets the lease uploads it.
    func snapshotTaken(_ bytes: [UInt8], offset: Int, streamID: String, sum: String) {
        guard let ac = writer?.ac, writer?.connected == true else { return }
        let key = "\(tokenPrefix.dropLast(4))digest:\(offset)"
        command(ac, ["HSET", key, options.settings.origin, sum]) { _ in }
        command(ac, ["EXPIRE", key, "86400"]) { _ in }
        command(ac, ["HGETALL", key]) { [self] reply in
            guard let reply, reply.pointee.type == REDIS_REPLY_ARRAY else { return }
            var others: [(String, String)] = []
            var k = 0
            while k + 1 < reply.pointee.elements {
                if let host = Self.text(reply.pointee.element[k]!), let theirs = Self.text(reply.pointee.element[k + 1]!), theirs != sum {
                    others.append((host, theirs))
                }
                k += 2
            }
            guard !others.isEmpty else { return }
            let detail = others.map { "\($0.0) has \($0.1)" }.joined(separator: ", ")
            logger.critical("cluster state digests differ: the hosts do not hold the same state", metadata: [
                "concord.offset": "\(offset)", "concord.digest": "\(sum)", "concord.others": "\(detail)",
            ])
            submit(.cluster(.digestMismatch(offset: offset, detail: "this host has \(sum), \(detail)")))
        }
        guard offset > snapshotOffset, !streamID.isEmpty else { return }
        // The lease, unless another host holds it (this host's own, from an
        // upload whose connection went, is taken again: else no snapshot
        // for the lease's 60 s).
        command(ac, ["EVAL", Self.leaseScript, "1", leaseKey, options.settings.origin, "60000"]) { [self] reply in
            guard let reply, reply.pointee.type == REDIS_REPLY_INTEGER, reply.pointee.integer == 1 else { return }  // another host writes this one
            guard upload == nil else { return }  // one at a time; the lease expires unused
            // Megabytes of chunks must not queue ahead of the writer's heartbeat
            // and appends: the upload gets a connection of its own.
            upload = (bytes, offset, streamID, sum)
            if let u = uploader, u.connected { startUpload() } else if uploader == nil { uploader = open(.uploader) }
        }
    }

    private var leaseKey: String { "concord:{\(options.settings.name)}:snaplease" }

    static let leaseScript = """
        local v = redis.call('GET', KEYS[1])
        if v and v ~= ARGV[1] then return 0 end
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
        return 1
        """

    /// Milliseconds a snapshot chunk lives until the finishing script keeps
    /// it: chunks of an upload that never finished (its connection went)
    /// expire by themselves instead of staying in Redis for good.
    static let unfinishedChunkTTL = "3600000"

    /// Drops the older snapshot, makes the new one the newest, and trims the
    /// log below the one that is now the older — only if this host still
    /// holds the lease (a host that paused past it must not overwrite) and
    /// every chunk was stored (Redis refuses a chunk near its `maxmemory`:
    /// a snapshot with missing chunks made the newest, twice in a row,
    /// would leave a trimmed log no host can join); else its chunks go.
    static let finishSnapshotScript = """
        local function chunks(offset, count, command)
          local sum = 0
          for i = 0, tonumber(count) - 1 do sum = sum + redis.call(command, ARGV[7] .. offset .. ':' .. i) end
          return sum
        end
        if redis.call('GET', KEYS[3]) ~= ARGV[1] then return redis.error_reply('CONCORD lost the snapshot lease') end
        local cur = redis.call('HMGET', KEYS[1], 'snap1_offset', 'snap1_id', 'snap1_chunks', 'snap1_len', 'snap1_sum', 'snap2_offset', 'snap2_chunks')
        if cur[1] and tonumber(cur[1]) >= tonumber(ARGV[2]) then
          -- This very snapshot, finished before (its answer was lost): the chunks just written are its.
          if cur[1] == ARGV[2] or cur[6] == ARGV[2] then chunks(ARGV[2], ARGV[4], 'PERSIST') end
          redis.call('DEL', KEYS[3])
          return {'stale', '0'}
        end
        local stored = chunks(ARGV[2], ARGV[4], 'STRLEN')
        if stored ~= tonumber(ARGV[5]) then
          chunks(ARGV[2], ARGV[4], 'DEL')
          redis.call('DEL', KEYS[3])
          return redis.error_reply('CONCORD the snapshot at ' .. ARGV[2] .. ' is missing chunks (' .. stored .. ' of ' .. ARGV[5] .. ' bytes stored): not made the newest')
        end
        chunks(ARGV[2], ARGV[4], 'PERSIST')
        if cur[6] then chunks(cur[6], cur[7], 'DEL') end
        if cur[1] then
          redis.call('HSET', KEYS[1], 'snap2_offset', cur[1], 'snap2_id', cur[2], 'snap2_chunks', cur[3], 'snap2_len', cur[4], 'snap2_sum', cur[5])
        end
        redis.call('HSET', KEYS[1], 'snap1_offset', ARGV[2], 'snap1_id', ARGV[3], 'snap1_chunks', ARGV[4], 'snap1_len', ARGV[5], 'snap1_sum', ARGV[6])
        local trimmed = 0
        if cur[2] then trimmed = redis.call('XTRIM', KEYS[2], 'MINID', cur[2]) end
        redis.call('DEL', KEYS[3])
        return {'ok', tostring(trimmed)}
        """

    /// Uploads an encoded snapshot in chunks, then finishes it (rotation, trim) in one script.
    private func startUpload() {
        guard let ac = uploader?.ac, let (bytes, offset, streamID, sum) = upload, !streamID.isEmpty else {
            upload = nil
            return
        }
        let prefix = "\(tokenPrefix.dropLast(4))snap:"
        let size = options.snapshotChunkBytes
        let chunks = max(1, (bytes.count + size - 1) / size)
        var failed = false
        for i in 0..<chunks {
            let part = Array(bytes[min(bytes.count, i * size)..<min(bytes.count, (i + 1) * size)])
            command(ac, [Array("SET".utf8), Array("\(prefix)\(offset):\(i)".utf8), part, Array("PX".utf8), Array(Self.unfinishedChunkTTL.utf8)]) { [self] reply in
                if reply == nil || reply!.pointee.type == REDIS_REPLY_ERROR {
                    if !failed { problem("uploading a cluster snapshot failed: \(reply.flatMap(Self.text) ?? "connection lost")") }
                    failed = true
                }
            }
        }
        // Commands on one connection run in order: the script sees every chunk.
        let args = ["EVAL", Self.finishSnapshotScript, "3", metaKey, logKey, leaseKey, options.settings.origin, String(offset), streamID,
                    String(chunks), String(bytes.count), sum, prefix]
        command(ac, args) { [self] reply in
            upload = nil  // done either way: the timer drops the connection
            guard !failed, let reply, reply.pointee.type == REDIS_REPLY_ARRAY, reply.pointee.elements == 2 else {
                if let reply, reply.pointee.type == REDIS_REPLY_ERROR { problem("finishing a cluster snapshot failed: \(Self.text(reply) ?? "?")") }
                return
            }
            snapshotsWritten += 1
            snapshotOffset = max(snapshotOffset, offset)
            logger.info("cluster snapshot stored", metadata: [
                "concord.offset": "\(offset)", "concord.bytes": "\(bytes.count)", "concord.chunks": "\(chunks)",
                "concord.result": "\(Self.text(reply.pointee.element[0]!) ?? "?")",
                "concord.trimmed_entries": "\(Self.text(reply.pointee.element[1]!) ?? "0")",
            ])
        }
    }

    static func fnvHex(_ bytes: [UInt8]) -> String {
        String(FNV1a.hash(bytes), radix: 16)
    }

    // MARK: Appending

    /// The script: dedupes a retried entry by its token, creates the log's
    /// meta (epoch) when missing, refuses a host of another engine version
    /// or with other outcome-changing options, extends the hash chain and
    /// XADDs — one round trip, atomic. The entry's time ("now" for the
    /// core) is the millisecond part of its stream ID: Redis's clock at the
    /// append, never going backwards within a stream, the same on every
    /// host. Four `redis.call`s per entry (the token's key is set with NX
    /// only after the checks, so a refused entry leaves no token behind);
    /// see OPERATIONS "Costs measured here" for what an entry costs Redis.
    static let script = """
        local m = redis.call('HMGET', KEYS[1], 'engine', 'options', 'epoch', 'offset', 'h')
        if not m[1] then
          local t = redis.call('TIME')
          m = {ARGV[1], ARGV[2], redis.sha1hex(ARGV[6] .. ':' .. t[1] .. '.' .. t[2]), '0', ''}
          redis.call('HSET', KEYS[1], 'engine', m[1], 'options', m[2], 'epoch', m[3], 'offset', '0', 'h', '')
        end
        if m[1] ~= ARGV[1] then
          return redis.error_reply('CONCORD the log was written by engine ' .. m[1] .. '; this host runs ' .. ARGV[1])
        end
        if m[2] ~= ARGV[2] then
          return redis.error_reply('CONCORD the cluster runs with options ' .. m[2] .. '; this host with ' .. ARGV[2])
        end
        if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[7]) then return {'dup', '0'} end
        local off = tonumber(m[4]) + 1
        local h = redis.sha1hex(m[5] .. ARGV[3])
        redis.call('XADD', KEYS[2], '*', 'o', tostring(off), 'p', m[5], 'h', h, 'e', m[3], 'g', ARGV[4], 'k', ARGV[3], 'm', ARGV[5])
        redis.call('HSET', KEYS[1], 'offset', tostring(off), 'h', h)
        return {'ok', tostring(off)}
        """

    private func loadScript() {
        guard let ac = writer?.ac, !scriptLoading, scriptSHA == nil else { return }
        scriptLoading = true
        command(ac, ["SCRIPT", "LOAD", Self.script]) { [self] reply in
            scriptLoading = false
            guard let reply, reply.pointee.type == REDIS_REPLY_STRING, let sha = Self.text(reply) else {
                if let reply { problem("the cluster log did not load the append script: \(Self.text(reply) ?? "?")") }
                return
            }
            scriptSHA = sha
            flush()
        }
    }

    /// Mutations the core wants appended (one delivery's worth: the batching window).
    func append(_ mutations: [(ref: Int, line: [UInt8])]) {
        guard !mutations.isEmpty else { return }
        guard told.attached else {
            submit(.cluster(.appendFailed(refs: mutations.map(\.ref), indeterminate: false, reason: "not attached to the cluster log")))
            return
        }
        let now = monotonicSeconds()
        var i = 0
        while i < mutations.count {
            var j = i
            var bytes = 0
            while j < mutations.count, j - i < options.maxEntryMutations, j == i || bytes + mutations[j].line.count <= options.maxEntryBytes {
                bytes += mutations[j].line.count + 12
                j += 1
            }
            let slice = Array(mutations[i..<j])
            nextToken += 1
            queue.append(Append(token: "\(options.settings.origin)-\(nextToken)", refs: slice.map(\.ref),
                                payload: ClusterEntry.encode(slice), firstQueued: now))
            i = j
        }
        flush()
    }

    private func flush() {
        guard let ac = writer?.ac, writer?.connected == true, let sha = scriptSHA, !queue.isEmpty else { return }
        // A token is only sent again within --cluster-timeout (then the host
        // gives up): its key outlives that with a wide margin, and no more —
        // at 1,000 entries/s each second of TTL is ~1,000 keys in Redis.
        let ttl = String(Int(max(60, options.settings.timeout * 4) * 1000))
        for var a in queue {
            a.sent = true
            inFlight[a.token] = a
            appendsSent += 1
            let args: [[UInt8]] = [
                Array("EVALSHA".utf8), Array(sha.utf8), Array("3".utf8),
                Array(metaKey.utf8), Array(logKey.utf8), Array((tokenPrefix + a.token).utf8),
                Array(options.engineVersion.utf8), Array(options.optionsFingerprint.utf8), Array(a.token.utf8),
                Array(options.settings.origin.utf8), a.payload, Array(nonce.utf8), Array(ttl.utf8),
            ]
            let token = a.token
            command(ac, args) { [self] reply in appended(token, reply) }
        }
        queue.removeAll()
    }

    private func appended(_ token: String, _ reply: UnsafeMutablePointer<redisReply>?) {
        guard var a = inFlight.removeValue(forKey: token) else { return }
        guard let reply else {
            // The connection went: unknown outcome. Sent again on the next
            // connection (the script knows the token if it went in), until the timeout.
            a.answerLost = true
            queue.append(a)
            return
        }
        if reply.pointee.type == REDIS_REPLY_ERROR {
            let message = Self.text(reply) ?? "?"
            if message.hasPrefix("NOSCRIPT") {
                scriptSHA = nil
                a.sent = false
                queue.append(a)
                loadScript()
                return
            }
            logger.error("the cluster log refused an append", metadata: ["concord.reason": "\(message)"])
            // Refused now; but an earlier attempt whose answer was lost may
            // have gone in (a resend after a restart answered `-LOADING`):
            // then the outcome is not known, and the token tells it.
            submit(.cluster(.appendFailed(refs: a.refs, indeterminate: a.answerLost, reason: message)))
            return
        }
        // "ok" or "dup": in the log; the reader brings it back and the core answers then.
        submit(.cluster(.appendConfirmed(refs: a.refs)))
    }

    /// Appends still queued after the cluster timeout are given up: the core
    /// answers them (`indeterminate` when one may have gone in).
    private func expireAppends(now: Double) {
        let limit = options.settings.timeout
        guard queue.contains(where: { now - $0.firstQueued > limit }) else { return }
        var keep: [Append] = []
        for a in queue {
            if now - a.firstQueued > limit {
                submit(.cluster(.appendFailed(refs: a.refs, indeterminate: a.sent, reason: "the cluster log was not reachable for \(limit) s")))
            } else {
                keep.append(a)
            }
        }
        queue = keep
    }

    // MARK: hiredis plumbing

    private func command(_ ac: UnsafeMutablePointer<redisAsyncContext>, _ args: [String], _ done: @escaping (UnsafeMutablePointer<redisReply>?) -> Void) {
        command(ac, args.map { Array($0.utf8) }, done)
    }

    private func command(_ ac: UnsafeMutablePointer<redisAsyncContext>, _ args: [[UInt8]], _ done: @escaping (UnsafeMutablePointer<redisReply>?) -> Void) {
        let box = Unmanaged.passRetained(ReplyBox(done)).toOpaque()
        // hiredis copies the arguments into its output buffer before returning.
        var pointers: [UnsafeMutablePointer<CChar>?] = args.map { a in
            let p = UnsafeMutablePointer<CChar>.allocate(capacity: max(1, a.count))
            a.withUnsafeBufferPointer { b in
                if let base = b.baseAddress { UnsafeMutableRawPointer(p).copyMemory(from: base, byteCount: a.count) }
            }
            return p
        }
        defer { for p in pointers { p?.deallocate() } }
        var lengths = args.map { $0.count }
        let status = pointers.withUnsafeMutableBufferPointer { ptrs in
            ptrs.baseAddress!.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: ptrs.count) { argv in
                redisAsyncCommandArgv(ac, { _, reply, priv in
                    guard let priv else { return }
                    let box = Unmanaged<ReplyBox>.fromOpaque(priv).takeRetainedValue()
                    box.run(reply?.assumingMemoryBound(to: redisReply.self))
                }, box, Int32(args.count), argv, &lengths)
            }
        }
        if status != 0 {
            // Not queued (the context is disconnecting): answered now, as hiredis would.
            Unmanaged<ReplyBox>.fromOpaque(box).takeRetainedValue().run(nil)
        }
    }

    /// A stream entry's `[field, value, …]` reply, by field name.
    static func fields(_ r: UnsafeMutablePointer<redisReply>) -> [String: UnsafeMutablePointer<redisReply>] {
        var f: [String: UnsafeMutablePointer<redisReply>] = [:]
        var k = 0
        while k + 1 < r.pointee.elements {
            if let name = text(r.pointee.element[k]!) { f[name] = r.pointee.element[k + 1]! }
            k += 2
        }
        return f
    }

    static func text(_ r: UnsafeMutablePointer<redisReply>) -> String? {
        switch r.pointee.type {
        case REDIS_REPLY_STRING, REDIS_REPLY_STATUS, REDIS_REPLY_ERROR:
            return String(decoding: UnsafeRawBufferPointer(start: r.pointee.str, count: r.pointee.len), as: UTF8.self)
        case REDIS_REPLY_INTEGER:
            return String(r.pointee.integer)
        default:
            return nil
        }
    }

    static func bytes(_ r: UnsafeMutablePointer<redisReply>) -> [UInt8]? {
        guard r.pointee.type == REDIS_REPLY_STRING else { return nil }
        return Array(UnsafeRawBufferPointer(start: r.pointee.str, count: r.pointee.len))
    }
}
