public import ConcordJSON
import ConcordProtocol
import ConcordSocket
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A connection to `concord-server` over its Unix socket.
///
/// Every protocol operation is an `async throws` call; subscriptions deliver
/// their events as an `AsyncStream`. The client owns one reader thread (a
/// blocking `recv` loop) and a serial queue for writes, so no call ever
/// blocks the caller's thread. When the server goes away the client
/// reconnects with backoff, re-establishes every subscription and sends each
/// one ``ConcordEvent/resynced(seq:state:)`` with its current state.
///
/// ```swift
/// let client = try await ConcordClient.connect()
/// let sub = try await client.subscribe(.key("home"))
/// try await client.update(["id": "Post:1", "title": "Hello"], key: "home")
/// for await event in sub.events { print(event) }
/// ```
public final class ConcordClient: @unchecked Sendable {
    /// The deepest line the client reads: twice the server's largest
    /// `--max-depth` (10,000) plus the envelope of an event.
    static let maxMessageDepth = 2 * 10_000 + 16

    // Sendable: mutable state lives in `state`, guarded by `lock`.

    /// Connection settings. Every member has a default.
    public struct Configuration: Sendable {
        /// Socket path; default as the server's (`DefaultSocket`): `$CONCORD_SOCKET`,
        /// else `$XDG_RUNTIME_DIR/concord/concord.sock`, else `/tmp/concord-<uid>/concord.sock`.
        public var socketPath: String
        /// Sent in `hello`.
        public var clientName = "ConcordClient"
        /// Reconnect when the server goes away (default true).
        public var reconnect = true
        /// First and longest wait between reconnection attempts.
        public var initialBackoff: Duration = .milliseconds(50)
        /// The longest wait between reconnection attempts (the wait doubles from `initialBackoff` up to it).
        public var maxBackoff: Duration = .seconds(2)
        /// How long a mutation whose answer was lost with the connection is
        /// retried (with its token, so it applies once) before it throws
        /// `.disconnected`.
        public var retryTimeout: Duration = .seconds(10)

        /// Settings for `socketPath` (nil: the default socket), other members at their defaults.
        public init(socketPath: String? = nil) {
            self.socketPath = socketPath ?? DefaultSocket.path
        }
    }

    /// The settings this client was connected with.
    public let configuration: Configuration
    /// Pending optimistic layers (``optimistic(_:_:)``) and the providers showing them.
    let layers = OptimisticLayers()
    private let lock = NSLock()
    private let writeQueue = DispatchQueue(label: "concord.client.write")
    private var state = State()

    private struct State {
        var fd: Int32 = -1
        var connected = false
        var closed = false
        var generation = 0
        var nextRid = 1
        var pending: [Int: CheckedContinuation<JSON, any Error>] = [:]
        var subscriptions: [String: SubscriptionState] = [:]
        var nextSubscription = 1
        var serverInfo: ServerInfo?
        /// The connection generation whose subscriptions are re-established.
        var resynced = 0
    }

    /// Server facts from `hello`.
    public struct ServerInfo: Sendable {
        /// The server's name (`concord-server`).
        public var server: String
        /// The server's version.
        public var version: String
        /// The protocol version it speaks (PROTOCOL.md).
        public var protocolVersion: Int
        /// The identity member of entities (`--id-key`).
        public var idKey: String
        /// The server's limits (line bytes, depth, subscriptions, …) as it reported them.
        public var limits: JSON
    }

    private init(configuration: Configuration) {
        self.configuration = configuration
    }

    /// What the server said in its last `hello` (on connect and after every reconnect).
    public var serverInfo: ServerInfo? { lock.withLock { state.serverInfo } }

    /// The server's identity member (`--id-key`, from `hello`; `"id"` until it answered).
    /// Typed models keep `var id` and, when the server uses another member,
    /// map it with `CodingKeys` (`case id = "_id"`).
    public var idKey: String { lock.withLock { state.serverInfo?.idKey } ?? "id" }

    func noteServerInfo(_ info: ServerInfo) {
        lock.withLock { state.serverInfo = info }
        layers.setIDKey(info.idKey)
    }

    /// Connects and says `hello`.
    public static func connect(_ configuration: Configuration = Configuration()) async throws -> ConcordClient {
        let client = ConcordClient(configuration: configuration)
        let fd = try Self.openSocket(configuration.socketPath)
        client.attach(fd)
        _ = try await client.hello()
        return client
    }

    /// Connects to the server on `socketPath` with default settings and says `hello`.
    public static func connect(socketPath: String) async throws -> ConcordClient {
        try await connect(Configuration(socketPath: socketPath))
    }

    /// Closes the connection; pending calls fail with `ConcordError.Code.closed` and streams finish.
    public func close() {
        let (fd, pending, subs) = lock.withLock { () -> (Int32, [CheckedContinuation<JSON, any Error>], [SubscriptionState]) in
            state.closed = true
            state.connected = false
            let out = (state.fd, Array(state.pending.values), Array(state.subscriptions.values))
            state.pending = [:]
            state.subscriptions = [:]
            state.fd = -1
            return out
        }
        if fd >= 0 { shutdown(fd, Int32(SHUT_RDWR)) }
        for c in pending { c.resume(throwing: ConcordError(.closed, "the client was closed")) }
        for s in subs { s.finish() }
    }

    deinit {
        let fd = state.fd
        if fd >= 0 { Glibc.close(fd) }
    }

    // MARK: Socket

    static func openSocket(_ path: String) throws -> Int32 {
        let fd: Int32
        do { fd = try UnixSocket.connect(path) } catch { throw ConcordError(.disconnected, error.description) }
        UnixSocket.setOption(fd, SO_KEEPALIVE, 1)
        return fd
    }

    @discardableResult
    private func attach(_ fd: Int32) -> Int {
        let generation = lock.withLock { () -> Int in
            state.fd = fd
            state.connected = true
            state.generation += 1
            // The first connection has nothing to re-establish.
            if state.generation == 1 { state.resynced = 1 }
            return state.generation
        }
        let reader = Thread { [self] in self.readLoop(fd: fd, generation: generation) }
        reader.name = "concord-client-reader"
        // Parsing is recursive: room for `maxMessageDepth` levels.
        reader.stackSize = 64 << 20
        reader.start()
        return generation
    }

    private func write(_ bytes: [UInt8], fd: Int32) {
        writeQueue.async {
            var off = 0
            while off < bytes.count {
                let n = bytes[off...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if n <= 0 { return }  // the reader sees the connection drop and handles it
                off += n
            }
        }
    }

    // MARK: Requests

    /// Sends one request object and returns the server's response object (`ok: true`).
    /// A `rid` is added; an `ok: false` answer throws its ``ConcordError``.
    public func request(_ object: JSONObject) async throws -> JSONObject {
        let response = try await withCheckedThrowingContinuation { (cont: CheckedContinuation<JSON, any Error>) in
            let (fd, rid, error) = lock.withLock { () -> (Int32, Int, ConcordError?) in
                if state.closed { return (-1, 0, ConcordError(.closed, "the client was closed")) }
                if !state.connected { return (-1, 0, ConcordError(.disconnected, "not connected to \(configuration.socketPath)")) }
                let rid = state.nextRid
                state.nextRid += 1
                state.pending[rid] = cont
                return (state.fd, rid, nil)
            }
            if let error {
                cont.resume(throwing: error)
                return
            }
            var o = object
            o["rid"] = .int(rid)
            var w = JSONWriter(capacity: 128)
            w.value(.object(o))
            w.bytes.append(0x0A)
            write(w.bytes, fd: fd)
        }
        guard case .object(let o) = response else { throw ConcordError(.badResponse, "a response was not an object") }
        if o["ok"] == .bool(true) { return o }
        let code = o["error"]?["code"]?.stringValue ?? "internal"
        let message = o["error"]?["message"]?.stringValue ?? ""
        var error = ConcordError(ConcordError.Code(code), message)
        error.indeterminate = o["error"]?["indeterminate"] == .bool(true)
        if error.code == .conflict, let e = o["error"]?.objectValue {
            func names(_ k: String) -> [String] { e["conflicts"]?[k]?.arrayValue?.compactMap(\.stringValue) ?? [] }
            error.conflict = ConcordError.Conflict(seq: e["seq"]?.numberValue?.intValue ?? 0, entities: names("entities"),
                                                   keys: names("keys"), collections: names("collections"))
        }
        throw error
    }

    func op(_ name: String, _ members: [(String, JSON?)] = []) async throws -> JSONObject {
        var o = JSONObject()
        o["op"] = .string(name)
        for (k, v) in members { if let v { o[k] = v } }
        return try await request(o)
    }

    // MARK: Reading

    private func readLoop(fd: Int32, generation: Int) {
        var reader = SocketLineReader(fd: fd)
        // Stored values nest at most `--max-depth` − 1 levels (at most 10,000);
        // a private model view can hold a stored value at a position as deep,
        // and the message around it adds a few levels.
        let parser = JSONParser(maxDepth: Self.maxMessageDepth)
        var group: EntityGroup?
        reader.readLines({ line in
            guard let v = try? parser.parse(line), case .object(let o) = v else { return true }
            if o["event"] != nil {
                route(event: o, group: &group)
            } else {
                flush(&group)
                deliver(response: v)
            }
            return true
        }, boundary: {
            // Events of one mutation are written together; a read boundary ends the group.
            flush(&group)
        })
        flush(&group)
        connectionLost(fd: fd, generation: generation)
    }

    /// `entity` events of one subscription and one `seq`, gathered into one group.
    private struct EntityGroup {
        var sub: String
        var seq: Int
        var changes: [EntityChange]
        var context: JSON?
    }

    private func flush(_ group: inout EntityGroup?) {
        guard let g = group else { return }
        group = nil
        subscription(g.sub)?.yield(.entities(seq: g.seq, g.changes, context: g.context))
    }

    private func route(event o: JSONObject, group: inout EntityGroup?) {
        guard let name = o["sub"]?.stringValue, let seq = o["seq"]?.numberValue?.intValue else { return }
        let context = o["context"]
        switch o["event"]?.stringValue {
        case "entity":
            let change = EntityChange(id: o["id"]?.stringValue ?? "", model: o["model"].flatMap { $0.isNull ? nil : $0 })
            if let g = group, g.sub == name, g.seq == seq {
                group!.changes.append(change)
                group!.context = context
            } else {
                flush(&group)
                group = EntityGroup(sub: name, seq: seq, changes: [change], context: context)
            }
        case "update":
            flush(&group)
            let model = o["model"].flatMap { $0.isNull ? nil : $0 }
            let changed = o["changed"]?.arrayValue?.compactMap { $0.stringValue } ?? []
            let deleted = o["deleted"]?.arrayValue?.compactMap { $0.stringValue } ?? []
            subscription(name)?.yield(.update(seq: seq, model: model, changed: changed, deleted: deleted, context: context))
        case "collection":
            flush(&group)
            let edits = (o["changes"]?.arrayValue ?? []).compactMap(CollectionEdit.init(json:))
            subscription(name)?.yield(.collection(seq: seq, edits, context: context))
        case "query":
            flush(&group)
            let edits = (o["changes"]?.arrayValue ?? []).compactMap(CollectionEdit.init(json:))
            let count = o["count"]?.numberValue?.intValue ?? 0
            subscription(name)?.yield(.query(seq: seq, edits, count: count, context: context))
        case "delete":
            flush(&group)
            let s = lock.withLock { state.subscriptions.removeValue(forKey: name) }
            if let e = o["error"]?.objectValue {
                let error = ConcordError(ErrorCode(e["code"]?.stringValue ?? "error"), e["message"]?.stringValue ?? "")
                s?.yield(.failed(seq: seq, error: error))
            } else {
                s?.yield(.ended(seq: seq, context: context))
            }
            s?.finish()
        default:
            break
        }
    }

    private func subscription(_ name: String) -> SubscriptionState? {
        lock.withLock { state.subscriptions[name] }
    }

    private func deliver(response v: JSON) {
        guard let rid = v["rid"]?.numberValue?.intValue else { return }
        let cont = lock.withLock { state.pending.removeValue(forKey: rid) }
        cont?.resume(returning: v)
    }

    // MARK: Reconnection

    private func connectionLost(fd: Int32, generation: Int) {
        let (pending, shouldReconnect) = lock.withLock { () -> ([CheckedContinuation<JSON, any Error>], Bool) in
            guard state.generation == generation else { return ([], false) }
            state.connected = false
            state.fd = -1
            let p = Array(state.pending.values)
            state.pending = [:]
            return (p, !state.closed && configuration.reconnect)
        }
        Glibc.close(fd)
        for c in pending { c.resume(throwing: ConcordError(.disconnected, "the connection to the server dropped")) }
        if !shouldReconnect {
            let subs = lock.withLock { () -> [SubscriptionState] in
                let s = Array(state.subscriptions.values)
                state.subscriptions = [:]
                return s
            }
            for s in subs { s.finish() }
            return
        }
        let t = Thread { [self] in self.reconnectLoop() }
        t.name = "concord-client-reconnect"
        t.start()
    }

    private func reconnectLoop() {
        var delay = configuration.initialBackoff
        while true {
            if lock.withLock({ state.closed }) { return }
            if let fd = try? Self.openSocket(configuration.socketPath) {
                let generation = attach(fd)
                Task { await self.resynchronize(generation) }
                return
            }
            let (s, a) = delay.components
            usleep(UInt32(min(Double(s) + Double(a) / 1e18, 10) * 1_000_000))
            delay = min(delay * 2, configuration.maxBackoff)
        }
    }

    /// Re-establishes every subscription on connection `generation` and
    /// tells each one. A pass whose connection was replaced stops at once:
    /// the newer connection's pass owns the subscriptions (a stale pass
    /// used to end the newer one's hold on a subscription's events, losing
    /// its resynced state and what it held).
    private func resynchronize(_ generation: Int) async {
        defer { lock.withLock { state.resynced = max(state.resynced, generation) } }
        func current() -> Bool { lock.withLock { state.generation == generation } }
        _ = try? await hello()
        let subs = lock.withLock { Array(state.subscriptions.values) }
        for s in subs {
            guard current() else { return }
            // Events after the answer wait until its state is handed over (the
            // answer resumes this task; events arrive on the reader thread).
            let hold = s.holdEvents()
            defer { s.dropHeld(hold) }  // a failure: the next reconnect resynchronizes
            do {
                var o = s.subscribeRequest(resync: true)
                o["op"] = "subscribe"
                // Only what changed while away (§3.2): a view that did not
                // change keeps its value; a feed gets what it missed replayed.
                let since = s.seenSeq
                o["since"] = .int(since)
                let r: JSONObject
                do {
                    r = try await request(o)
                } catch let e as ConcordError where e.code == .badRequest {
                    // The server is behind what we saw (it restarted without its state): start over.
                    o["since"] = nil
                    r = try await request(o)
                }
                guard current() else { return }
                let seq = r["seq"]?.numberValue?.intValue ?? 0
                if r["unchanged"] == .bool(true) {
                    s.noteSeq(seq)
                    s.releaseHeld(hold)
                    if s.isPaused { _ = try? await op("pause", [("sub", .string(s.name))]) }
                    continue
                }
                if r["truncated"] == .bool(true) {
                    s.releaseHeld(hold, first: .truncated(seq: seq))
                    if s.isPaused { _ = try? await op("pause", [("sub", .string(s.name))]) }
                    continue
                }
                if case .feed = s.targetSnapshot {
                    s.noteSeq(seq)
                    s.releaseHeld(hold)
                    if s.isPaused { _ = try? await op("pause", [("sub", .string(s.name))]) }
                    continue
                }
                var stateValue = r["model"] ?? r["items"] ?? r["models"] ?? .null
                // A query's state is its window and its count.
                if let count = r["count"] { stateValue = ["items": stateValue, "count": count] }
                s.noteResynced(stateValue)
                s.releaseHeld(hold, first: .resynced(seq: seq, state: stateValue))
                if s.isPaused { _ = try? await op("pause", [("sub", .string(s.name))]) }
            } catch let e as ConcordError where [.disconnected, .shuttingDown, .closed].contains(e.code) {
                // This connection is going away too (a server that is still
                // stopping accepted it): the next reconnect resynchronizes.
                continue
            } catch {
                guard current() else { return }
                s.dropHeld(hold)
                let removed = lock.withLock { state.subscriptions.removeValue(forKey: s.name) }
                removed?.yield(.ended(seq: 0, context: nil))
                removed?.finish()
            }
        }
    }

    // MARK: Subscriptions (internal registry)

    func registerIfAbsent(_ s: SubscriptionState) -> Bool {
        lock.withLock {
            if state.subscriptions[s.name] != nil { return false }
            state.subscriptions[s.name] = s
            return true
        }
    }

    func subscriptionState(_ name: String) -> SubscriptionState? { subscription(name) }

    func unregister(_ name: String) -> SubscriptionState? {
        lock.withLock { state.subscriptions.removeValue(forKey: name) }
    }

    func generatedName(_ prefix: String) -> String {
        lock.withLock {
            defer { state.nextSubscription += 1 }
            return "\(prefix)\(state.nextSubscription)"
        }
    }

    /// True while a connection to the server is up.
    public var isConnected: Bool { lock.withLock { state.connected } }

    /// Waits until a new connection is up and its subscriptions are back
    /// (so a retried mutation's `origin` exists again); false at the
    /// deadline or when the client is closed or does not reconnect.
    func waitForReconnect(after generation: Int, until deadline: ContinuousClock.Instant) async -> Bool {
        while ContinuousClock.now < deadline {
            let (ready, over) = lock.withLock { () -> (Bool, Bool) in
                (state.connected && state.generation > generation && state.resynced >= state.generation,
                 state.closed || !configuration.reconnect)
            }
            if ready { return true }
            if over { return false }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return false
    }

    var connectionGeneration: Int { lock.withLock { state.generation } }
}
