import CLibUV
import ConcordCore
import ConcordProtocol
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Why the server could not start. The description is the one line printed before exiting.
public struct StartupError: Error, CustomStringConvertible {
    public let description: String
}

/// Hand-off from the sequencer thread to the loop: deliveries queue here
/// and one `uv_async_send` (which coalesces) wakes the loop for all of them.
final class Bridge: @unchecked Sendable {
    // Sendable: `pending` is guarded by `condition`; `async` is only passed to
    // uv_async_send, the one libuv call that is safe from any thread.
    private let condition = Condition()
    private var pending: [Sequencer.Delivery] = []
    private var closed = false
    let async: UnsafeMutablePointer<uv_async_t>

    init(async: UnsafeMutablePointer<uv_async_t>) { self.async = async }

    func post(_ d: Sequencer.Delivery) {
        condition.lock()
        defer { condition.unlock() }
        // After shutdown the async handle is gone; late output has no reader left.
        guard !closed else { return }
        pending.append(d)
        uv_async_send(async)
    }

    /// Called on the loop before the async handle is closed.
    func close() {
        condition.lock()
        closed = true
        condition.unlock()
    }

    func take() -> [Sequencer.Delivery] {
        condition.lock()
        defer { condition.unlock() }
        let out = pending
        pending = []
        return out
    }
}

/// One accepted client, owned by the loop thread.
final class Connection {
    let id: ConnectionID
    let pipe: UnsafeMutablePointer<uv_pipe_t>
    var framer: LineFramer
    var closing = false
    /// Close once the last queued write completes (shutdown).
    var closeWhenFlushed = false
    var pendingWrites = 0

    init(id: ConnectionID, pipe: UnsafeMutablePointer<uv_pipe_t>, maxLineBytes: Int) {
        self.id = id
        self.pipe = pipe
        self.framer = LineFramer(maxLineBytes: maxLineBytes)
    }

    var stream: UnsafeMutablePointer<uv_stream_t> { UnsafeMutableRawPointer(pipe).assumingMemoryBound(to: uv_stream_t.self) }
    var handle: UnsafeMutablePointer<uv_handle_t> { UnsafeMutableRawPointer(pipe).assumingMemoryBound(to: uv_handle_t.self) }
}

/// Keeps a write's buffers alive until libuv is done with them.
final class WriteContext {
    let connection: Connection
    let segments: [OutputChunk]
    let bufs: UnsafeMutablePointer<uv_buf_t>

    init(connection: Connection, segments: [OutputChunk]) {
        self.connection = connection
        self.segments = segments
        bufs = .allocate(capacity: max(segments.count, 1))
        for (i, s) in segments.enumerated() {
            bufs[i] = uv_buf_t(base: UnsafeMutablePointer(mutating: s.base.assumingMemoryBound(to: CChar.self)), len: s.count)
        }
    }

    deinit { bufs.deallocate() }
}

/// `concord-server`: the libuv loop (socket I/O only) in front of the
/// sequencer thread and its workers. See docs/ARCHITECTURE.md.
public final class Server {
    let configuration: ServerConfiguration
    let logger: Logger
    let loop: UnsafeMutablePointer<uv_loop_t>
    private var listener: UnsafeMutablePointer<uv_pipe_t>?
    private let wakeHandle: UnsafeMutablePointer<uv_async_t>
    private var signalHandles: [UnsafeMutablePointer<uv_signal_t>] = []
    private var drainTimer: UnsafeMutablePointer<uv_timer_t>?
    private let bridge: Bridge
    private var sequencer: Sequencer!
    private var connections: [ConnectionID: Connection] = [:]
    private var nextID = 1
    fileprivate let readBuffer = UnsafeMutableRawPointer.allocate(byteCount: 1 << 16, alignment: 16)
    private var shuttingDown = false
    private var drained = false
    private var finished = false

    public init(configuration: ServerConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        loop = .allocate(capacity: 1)
        uv_loop_init(loop)
        wakeHandle = .allocate(capacity: 1)
        bridge = Bridge(async: wakeHandle)
    }

    /// Binds, serves until SIGINT/SIGTERM, drains, removes the socket. Returns the exit status.
    public func run() throws(StartupError) -> Int32 {
        signal(SIGPIPE, SIG_IGN)
        // A parent may hand us a blocked SIGTERM (spawners often do); we must see it.
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGTERM)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
        uv_loop_set_data(loop, Unmanaged.passUnretained(self).toOpaque())
        try prepareSocketPath()

        let bridge = self.bridge
        sequencer = Sequencer(configuration: configuration, logger: logger) { bridge.post($0) }
        if configuration.cache != "none" {
            // dlopen and open() happen here, before the loop runs: never on the loop.
            do {
                let backend = try Backend.open(spec: configuration.cache, configJSON: configuration.cacheConfig, logger: logger)
                sequencer.attach(backend: backend, durability: configuration.durability, memoryLimit: configuration.memoryLimit, logger: logger)
            } catch {
                throw StartupError(description: error.description)
            }
        }
        try listen()

        uv_async_init(loop, wakeHandle) { h in Server.from(h).deliveriesArrived() }
        uv_handle_set_data(asHandle(wakeHandle), Unmanaged.passUnretained(self).toOpaque())
        for sig in [SIGINT, SIGTERM] {
            let s = UnsafeMutablePointer<uv_signal_t>.allocate(capacity: 1)
            uv_signal_init(loop, s)
            uv_handle_set_data(asHandle(s), Unmanaged.passUnretained(self).toOpaque())
            uv_signal_start(s, { h, signum in Server.from(h).beginShutdown(signal: signum) }, sig)
            signalHandles.append(s)
        }
        sequencer.start()

        logger.info("concord-server listening", metadata: [
            "concord.socket": "\(configuration.socketPath)",
            "concord.threads": "\(configuration.threads)",
            "concord.id_key": "\(configuration.engine.idKey)",
            "concord.max_line_bytes": "\(configuration.engine.maxLineBytes)",
            "concord.max_output_bytes": "\(configuration.maxOutputBytes)",
            "concord.cache": "\(configuration.cache)",
            "concord.durability": "\(configuration.durability.rawValue)",
            "concord.memory_limit": "\(configuration.memoryLimit)",
        ])
        uv_run(loop, UV_RUN_DEFAULT)
        sequencer.stopStorage()
        unlink(configuration.socketPath)
        logger.info("concord-server stopped", metadata: ["concord.socket": "\(configuration.socketPath)"])
        return 0
    }

    // MARK: Start-up

    private func prepareSocketPath() throws(StartupError) {
        let path = configuration.socketPath
        if path.utf8.count > 107 {
            throw StartupError(description: "socket path is \(path.utf8.count) bytes; Unix sockets allow at most 107: \(path)")
        }
        var st = stat()
        guard lstat(path, &st) == 0 else { return }
        guard (st.st_mode & S_IFMT) == S_IFSOCK else {
            throw StartupError(description: "\(path) exists and is not a socket; refusing to replace it")
        }
        if Self.someoneAnswers(path) {
            throw StartupError(description: "another server is already listening on \(path)")
        }
        if unlink(path) != 0 {
            throw StartupError(description: "cannot remove stale socket \(path): \(String(cString: strerror(errno)))")
        }
        logger.info("replaced a stale socket file", metadata: ["concord.socket": "\(path)"])
    }

    /// True when a process accepts connections on `path`.
    static func someoneAnswers(_ path: String) -> Bool {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            let bytes = Array(path.utf8.prefix(raw.count - 1))
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        return rc == 0
    }

    private func listen() throws(StartupError) {
        let p = UnsafeMutablePointer<uv_pipe_t>.allocate(capacity: 1)
        uv_pipe_init(loop, p, 0)
        uv_handle_set_data(asHandle(p), Unmanaged.passUnretained(self).toOpaque())
        do {
            try uvCall("uv_pipe_bind", uv_pipe_bind(p, configuration.socketPath))
            if chmod(configuration.socketPath, mode_t(configuration.socketMode)) != 0 {
                throw StartupError(description: "cannot chmod \(configuration.socketPath): \(String(cString: strerror(errno)))")
            }
            try uvCall("uv_listen", uv_listen(asStream(p), 511) { server, status in
                Server.from(server).accept(status: status)
            })
        } catch let e as UVError {
            throw StartupError(description: "cannot listen on \(configuration.socketPath): \(e)")
        } catch let e as StartupError {
            throw e
        } catch {
            throw StartupError(description: "cannot listen on \(configuration.socketPath): \(error)")
        }
        listener = p
    }

    // MARK: Connections

    fileprivate func accept(status: Int32) {
        guard status >= 0, !shuttingDown else { return }
        let p = UnsafeMutablePointer<uv_pipe_t>.allocate(capacity: 1)
        uv_pipe_init(loop, p, 0)
        let rc = uv_accept(asStream(listener!), asStream(p))
        guard rc == 0 else {
            logger.error("accept failed", metadata: ["concord.error": "\(uvErrorName(Int(rc)))"])
            uv_close(asHandle(p)) { h in h?.deallocate() }
            return
        }
        let conn = Connection(id: nextID, pipe: p, maxLineBytes: configuration.engine.maxLineBytes)
        nextID += 1
        connections[conn.id] = conn
        uv_handle_set_data(conn.handle, Unmanaged.passRetained(conn).toOpaque())
        sequencer.submit(.open(conn.id))
        logger.info("connection opened", metadata: ["concord.conn.id": "\(conn.id)"])
        uv_read_start(conn.stream, { h, _, buf in
            let server = Server.serverOf(connectionHandle: h!)
            buf!.pointee = uv_buf_t(base: server.readBuffer.assumingMemoryBound(to: CChar.self), len: 1 << 16)
        }, { stream, nread, buf in
            let conn = Unmanaged<Connection>.fromOpaque(uv_handle_get_data(asHandle(stream!))!).takeUnretainedValue()
            let server = Server.serverOf(connectionHandle: asHandle(stream!))
            server.read(conn, nread: nread, base: buf?.pointee.base)
        })
    }

    fileprivate static func serverOf(connectionHandle h: UnsafeMutablePointer<uv_handle_t>) -> Server {
        let loop = uv_handle_get_loop(h)!
        return Unmanaged<Server>.fromOpaque(uv_loop_get_data(loop)!).takeUnretainedValue()
    }

    private func read(_ conn: Connection, nread: Int, base: UnsafeMutablePointer<CChar>?) {
        if nread < 0 {
            let reason = nread == Int(UV_EOF.rawValue) ? "closed by peer" : uvErrorName(nread)
            closeConnection(conn, reason: reason)
            return
        }
        guard nread > 0, let base else { return }
        var frames: [LineFramer.Frame] = []
        conn.framer.feed(UnsafeRawBufferPointer(start: base, count: nread)) { frames.append($0) }
        if !frames.isEmpty { sequencer.submit(.frames(conn.id, frames)) }
    }

    private func closeConnection(_ conn: Connection, reason: String) {
        guard !conn.closing else { return }
        conn.closing = true
        connections[conn.id] = nil
        sequencer.submit(.close(conn.id))
        logger.info("connection closed", metadata: ["concord.conn.id": "\(conn.id)", "concord.reason": "\(reason)"])
        uv_close(conn.handle) { h in
            let conn = Unmanaged<Connection>.fromOpaque(uv_handle_get_data(h!)!).takeRetainedValue()
            conn.pipe.deallocate()
        }
        maybeFinish()
    }

    // MARK: Output

    fileprivate func deliveriesArrived() {
        for d in bridge.take() {
            for (id, segments) in d.outputs {
                guard let conn = connections[id], !conn.closing else { continue }
                write(conn, segments)
            }
            if d.drained { startClosing() }
        }
    }

    private func write(_ conn: Connection, _ segments: [OutputChunk]) {
        let ctx = WriteContext(connection: conn, segments: segments)
        let req = UnsafeMutablePointer<uv_write_t>.allocate(capacity: 1)
        req.pointee.data = Unmanaged.passRetained(ctx).toOpaque()
        let rc = uv_write(req, conn.stream, ctx.bufs, UInt32(segments.count)) { req, status in
            let ctx = Unmanaged<WriteContext>.fromOpaque(req!.pointee.data).takeRetainedValue()
            req!.deallocate()
            let conn = ctx.connection
            conn.pendingWrites -= 1
            guard !conn.closing else { return }
            let server = Server.serverOf(connectionHandle: conn.handle)
            if status < 0 {
                server.closeConnection(conn, reason: "write failed: \(uvErrorName(Int(status)))")
            } else if conn.closeWhenFlushed && conn.pendingWrites == 0 {
                server.closeConnection(conn, reason: "server shutdown")
            }
        }
        if rc < 0 {
            Unmanaged<WriteContext>.fromOpaque(req.pointee.data).release()
            req.deallocate()
            closeConnection(conn, reason: "write failed: \(uvErrorName(Int(rc)))")
            return
        }
        conn.pendingWrites += 1
        let queued = uv_stream_get_write_queue_size(conn.stream)
        if queued > configuration.maxOutputBytes {
            logger.warning("disconnecting a client that stopped reading", metadata: [
                "concord.conn.id": "\(conn.id)", "concord.queued_bytes": "\(queued)",
                "concord.max_output_bytes": "\(configuration.maxOutputBytes)",
            ])
            closeConnection(conn, reason: "output limit exceeded")
        }
    }

    // MARK: Shutdown

    fileprivate func beginShutdown(signal signum: Int32) {
        guard !shuttingDown else { return }
        shuttingDown = true
        logger.info("shutting down", metadata: ["concord.signal": "\(signum)"])
        if let l = listener {
            uv_close(asHandle(l)) { h in h?.deallocate() }
            listener = nil
        }
        sequencer.submit(.shutdown)
    }

    /// The core has answered everything read before the signal: flush and close.
    private func startClosing() {
        drained = true
        // A client that never reads must not hold the shutdown forever.
        let t = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
        uv_timer_init(loop, t)
        uv_handle_set_data(asHandle(t), Unmanaged.passUnretained(self).toOpaque())
        uv_timer_start(t, { h in
            let server = Server.from(h)
            for conn in Array(server.connections.values) { server.closeConnection(conn, reason: "shutdown timeout") }
        }, 3000, 0)
        drainTimer = t
        for conn in Array(connections.values) {
            uv_read_stop(conn.stream)
            if conn.pendingWrites == 0 {
                closeConnection(conn, reason: "server shutdown")
            } else {
                conn.closeWhenFlushed = true
            }
        }
        maybeFinish()
    }

    private func maybeFinish() {
        guard drained, connections.isEmpty, !finished else { return }
        finished = true
        if let t = drainTimer {
            uv_timer_stop(t)
            uv_close(asHandle(t)) { h in h?.deallocate() }
            drainTimer = nil
        }
        for s in signalHandles {
            uv_signal_stop(s)
            uv_close(asHandle(s)) { h in h?.deallocate() }
        }
        signalHandles = []
        bridge.close()
        uv_close(asHandle(wakeHandle), nil)
    }

    fileprivate static func from<T>(_ h: UnsafeMutablePointer<T>?) -> Server {
        Unmanaged<Server>.fromOpaque(uv_handle_get_data(asHandle(h!))!).takeUnretainedValue()
    }
}

@inline(__always)
func asHandle<T>(_ p: UnsafeMutablePointer<T>) -> UnsafeMutablePointer<uv_handle_t> {
    UnsafeMutableRawPointer(p).assumingMemoryBound(to: uv_handle_t.self)
}

@inline(__always)
func asStream<T>(_ p: UnsafeMutablePointer<T>) -> UnsafeMutablePointer<uv_stream_t> {
    UnsafeMutableRawPointer(p).assumingMemoryBound(to: uv_stream_t.self)
}
