import CConcordRuntime
import CLibUV
import ConcordCore
import ConcordJSON
import ConcordProtocol
import ConcordSocket
import CoreMetrics
public import Logging
import Synchronization

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
    let flow = ConnectionFlow()
    var closing = false
    /// Close once the last queued write completes (shutdown, or over the hard limit).
    var closeWhenFlushed = false
    var closeReason = ""
    /// Output handed over by the core, waiting for the write in flight.
    var queued: [OutputChunk] = []
    var queuedBytes = 0
    /// The one write in flight (whole lines only, so a close never cuts a line).
    var inFlight: WriteContext?
    var reading = false
    /// Unfinished-line bytes this connection's framer holds, as last counted.
    var unfinished = 0
    /// The coalescing episode whose drain was last reported to the core.
    var drainReported = 0
    /// Seconds spent over the hard limit with a write that does not finish.
    var overflowTicks = 0

    init(id: ConnectionID, pipe: UnsafeMutablePointer<uv_pipe_t>, maxLineBytes: Int) {
        self.id = id
        self.pipe = pipe
        self.framer = LineFramer(maxLineBytes: maxLineBytes)
    }

    var stream: UnsafeMutablePointer<uv_stream_t> { UnsafeMutableRawPointer(pipe).assumingMemoryBound(to: uv_stream_t.self) }
    var handle: UnsafeMutablePointer<uv_handle_t> { UnsafeMutableRawPointer(pipe).assumingMemoryBound(to: uv_handle_t.self) }

    /// Bytes not yet taken by the socket: the queue plus what libuv still holds of the write in flight.
    var unsentNow: Int { queuedBytes + uv_stream_get_write_queue_size(stream) }
}

/// Keeps a write's buffers alive until libuv is done with them.
final class WriteContext {
    let connection: Connection
    let segments: [OutputChunk]
    let bufs: UnsafeMutablePointer<uv_buf_t>
    let byteCount: Int

    init(connection: Connection, segments: [OutputChunk]) {
        self.connection = connection
        self.segments = segments
        bufs = .allocate(capacity: max(segments.count, 1))
        var n = 0
        for (i, s) in segments.enumerated() {
            bufs[i] = uv_buf_t(base: UnsafeMutablePointer(mutating: s.base.assumingMemoryBound(to: CChar.self)), len: s.count)
            n += s.count
        }
        byteCount = n
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
    private var overflowTimer: UnsafeMutablePointer<uv_timer_t>?
    /// Connections not being read (flow control), to look at again when something drains.
    private var stalled: [ConnectionID: Connection] = [:]
    /// Bytes of unfinished lines held by all framers, and who may exceed the budget.
    private var unfinishedTotal = 0
    private var lineGrant: ConnectionID?
    /// Accepts that failed in the current episode.
    private var acceptFailures = 0
    /// Descriptors open before any connection, and the process's limit.
    private var fdBaseline = 0
    private var fdLimit = Int.max
    private var atDescriptorLimit = false
    private let bridge: Bridge
    private var sequencer: Sequencer!
    private var metricsEndpoint: MetricsEndpoint?
    private var metrics: ServerMetrics { sequencer.metrics }
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

    deinit {
        // After `run` (every handle closed) or a failed start-up: free what
        // the loop owned, so a leak checker sees nothing at exit.
        uv_loop_close(loop)
        loop.deallocate()
        wakeHandle.deallocate()
        readBuffer.deallocate()
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
                try sequencer.attach(backend: backend, configuration: configuration, logger: logger)
            } catch {
                throw StartupError(description: error.description)
            }
        }
        do {
            try listen()
        } catch {
            // The backend is open and its thread runs: stop it (nothing was written).
            sequencer.abandonStorage()
            throw error
        }
        if let address = configuration.metricsAddress {
            let sequencer = self.sequencer!
            let m = MetricsEndpoint(loop: loop, logger: logger) { token in sequencer.submit(.metrics(token: token)) }
            do {
                try m.listen(address)
            } catch {
                m.close()
                uv_close(asHandle(listener!)) { h in h?.deallocate() }
                listener = nil
                uv_run(loop, UV_RUN_NOWAIT)
                unlink(configuration.socketPath)
                sequencer.abandonStorage()
                throw error
            }
            metricsEndpoint = m
        }
        if !configuration.allowUIDs.isEmpty || !configuration.allowGIDs.isEmpty, configuration.socketMode & 0o007 == 0 {
            let groupOnly = configuration.socketMode & 0o070 != 0
            if !configuration.allowUIDs.isEmpty || !groupOnly {
                logger.warning("--allow-uid/--allow-gid name other users, but the socket's mode lets only \(groupOnly ? "its group" : "its owner") open it; use --socket-mode 0666 (or 0660 for a group) and a directory they can enter", metadata: [
                    "concord.socket_mode": "\(String(configuration.socketMode, radix: 8))",
                ])
            }
        }

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
        var rl = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &rl) == 0 && rl.rlim_cur < UInt64(Int32.max) { fdLimit = Int(rl.rlim_cur) }
        fdBaseline = (try? FileManagerLite.countEntries("/proc/self/fd")) ?? 16

        logger.info("concord-server listening", metadata: [
            "concord.socket": "\(configuration.socketPath)",
            "concord.threads": "\(configuration.threads)",
            "concord.id_key": "\(configuration.engine.idKey)",
            "concord.max_line_bytes": "\(configuration.engine.maxLineBytes)",
            "concord.max_output_bytes": "\(configuration.maxOutputBytes)",
            "concord.output_soft_bytes": "\(configuration.engine.outputSoftBytes)",
            "concord.max_input_bytes": "\(configuration.maxInputBytes)",
            "concord.max_inbox_bytes": "\(configuration.maxInboxBytes)",
            "concord.cache": "\(configuration.cache)",
            "concord.durability": "\(configuration.durability.rawValue)",
            "concord.memory_limit": "\(configuration.memoryLimit)",
            "concord.metrics": "\(configuration.metricsAddress ?? "off")",
        ])
        uv_run(loop, UV_RUN_DEFAULT)
        // A second signal must not cut the final store short (SIGKILL still does).
        signal(SIGTERM, SIG_IGN)
        signal(SIGINT, SIG_IGN)
        let unstored = sequencer.stopStorage()
        unlink(configuration.socketPath)
        if unstored > 0 {
            logger.critical("concord-server stopped with records the cache backend did not store", metadata: [
                "concord.socket": "\(configuration.socketPath)", "concord.unstored_records": "\(unstored)",
            ])
            return 3
        }
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
        let dir = path.contains("/") ? String(path[..<path.lastIndex(of: "/")!]) : "."
        if !dir.isEmpty {
            try checkSocketDirectory(dir)
        }
        guard lstat(path, &st) == 0 else { return }
        guard (st.st_mode & S_IFMT) == S_IFSOCK else {
            throw StartupError(description: "\(path) exists and is not a socket; refusing to replace it")
        }
        if UnixSocket.someoneAnswers(path) {
            throw StartupError(description: "another server is already listening on \(path)")
        }
        if unlink(path) != 0 {
            throw StartupError(description: "cannot remove stale socket \(path): \(String(cString: strerror(errno)))")
        }
        logger.info("replaced a stale socket file", metadata: ["concord.socket": "\(path)"])
    }

    /// The socket's directory must exist and be writable by this user only:
    /// anyone else who can write it can bind the path first and receive every
    /// client's traffic. The default private directory is created (0700).
    private func checkSocketDirectory(_ dir: String) throws(StartupError) {
        var ds = stat()
        if lstat(dir, &ds) != 0 {
            guard dir == DefaultSocket.privateDirectory else {
                throw StartupError(description: "the socket's directory \(dir) does not exist (create it, or choose another --socket)")
            }
            if mkdir(dir, 0o700) != 0 && errno != EEXIST {
                throw StartupError(description: "cannot create the socket directory \(dir): \(String(cString: strerror(errno)))")
            }
            logger.info("created the private socket directory", metadata: ["concord.dir": "\(dir)"])
            guard lstat(dir, &ds) == 0 else {
                throw StartupError(description: "cannot read the socket directory \(dir): \(String(cString: strerror(errno)))")
            }
        }
        if (ds.st_mode & S_IFMT) == S_IFLNK && dir == DefaultSocket.privateDirectory {
            throw StartupError(description: "the private socket directory \(dir) is a symbolic link; refusing it (another user may have planted it)")
        }
        if (ds.st_mode & S_IFMT) == S_IFLNK { _ = stat(dir, &ds) }
        if (ds.st_mode & S_IFMT) != S_IFDIR {
            throw StartupError(description: "\(dir) is not a directory; cannot create the socket in it")
        }
        if dir == DefaultSocket.privateDirectory && ds.st_uid != getuid() {
            throw StartupError(description: "the private socket directory \(dir) belongs to uid \(ds.st_uid), not to this user (\(getuid())); refusing it")
        }
        if ds.st_mode & 0o022 != 0 {
            let mode = String(ds.st_mode & 0o7777, radix: 8)
            throw StartupError(description: "the socket's directory \(dir) is writable by other users (mode \(mode)): one of them could bind the socket first and receive every client's traffic; use a directory only you can write (the default is \(DefaultSocket.privateDirectory))")
        }
        if access(dir, W_OK | X_OK) != 0 {
            throw StartupError(description: "no permission to create the socket in \(dir): \(String(cString: strerror(errno)))")
        }
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
        guard !shuttingDown else { return }
        guard status >= 0 else {
            // EMFILE/ENFILE: libuv has already accepted and closed the pending
            // connection (its reserve-fd trick). Log once per episode.
            noteAcceptFailure(status)
            return
        }
        let p = UnsafeMutablePointer<uv_pipe_t>.allocate(capacity: 1)
        uv_pipe_init(loop, p, 0)
        let rc = uv_accept(asStream(listener!), asStream(p))
        guard rc == 0 else {
            noteAcceptFailure(rc)
            uv_close(asHandle(p)) { h in h?.deallocate() }
            return
        }
        let conn = Connection(id: nextID, pipe: p, maxLineBytes: configuration.engine.maxLineBytes)
        nextID += 1
        let peer = Self.peerCredentials(conn)
        if !isAllowed(peer) {
            refuse(conn, peer: peer)
            return
        }
        metrics.connectionsAccepted.increment()
        connections[conn.id] = conn
        // libuv refuses connections past the descriptor limit on its own (it
        // accepts and closes them, with no callback): say so when we get there.
        if !atDescriptorLimit && fdBaseline + connections.count + (metricsEndpoint?.activeExchanges ?? 0) + 2 >= fdLimit {
            atDescriptorLimit = true
            logger.error("cannot accept connections: out of file descriptors; new connections are closed at once until some close", metadata: [
                "concord.fd_limit": "\(fdLimit)", "concord.connections": "\(connections.count)",
            ])
        }
        uv_handle_set_data(conn.handle, Unmanaged.passRetained(conn).toOpaque())
        sequencer.submit(.open(conn.id, conn.flow, peer))
        logger.info("connection opened", metadata: ["concord.conn.id": "\(conn.id)"])
        updateReading(conn)
    }

    /// `--allow-uid` / `--allow-gid`: no lists, or the peer is this server's
    /// user, or its uid or gid is listed. Unknown credentials are refused.
    private func isAllowed(_ peer: PeerCredentials?) -> Bool {
        if configuration.allowUIDs.isEmpty && configuration.allowGIDs.isEmpty { return true }
        guard let peer else { return false }
        return peer.uid == getuid() || configuration.allowUIDs.contains(peer.uid) || configuration.allowGIDs.contains(peer.gid)
    }

    /// One `forbidden` line (the socket buffer of a new connection takes it
    /// whole), then close. Nothing reaches the core.
    private func refuse(_ conn: Connection, peer: PeerCredentials?) {
        metrics.connectionsRefused.increment()
        let who = peer.map { "uid \($0.uid) gid \($0.gid) (pid \($0.pid))" } ?? "a peer with unknown credentials"
        logger.warning("connection refused: peer not allowed", metadata: [
            "concord.peer.uid": "\(peer.map { String($0.uid) } ?? "?")", "concord.peer.gid": "\(peer.map { String($0.gid) } ?? "?")",
            "concord.peer.pid": "\(peer.map { String($0.pid) } ?? "?")",
        ])
        let line = #"{"ok":false,"error":{"code":"forbidden","message":"#
        var w = JSONWriter(capacity: 160)
        w.string("\(who) may not use this server: it allows only the uids and gids given with --allow-uid/--allow-gid")
        var bytes = Array(line.utf8) + w.bytes + Array("}}\n".utf8)
        bytes.withUnsafeMutableBytes { raw in
            var buf = uv_buf_t(base: raw.baseAddress!.assumingMemoryBound(to: CChar.self), len: raw.count)
            _ = uv_try_write(conn.stream, &buf, 1)
        }
        uv_handle_set_data(conn.handle, Unmanaged.passRetained(conn).toOpaque())
        connections[conn.id] = nil
        uv_close(conn.handle) { h in
            let conn = Unmanaged<Connection>.fromOpaque(uv_handle_get_data(h!)!).takeRetainedValue()
            conn.pipe.deallocate()
        }
    }

    /// After a close: the end of a descriptor-limit episode.
    private func checkDescriptorsFreed() {
        if atDescriptorLimit && fdBaseline + connections.count + 2 < fdLimit {
            atDescriptorLimit = false
            logger.notice("accepting connections again", metadata: ["concord.connections": "\(connections.count)"])
        }
    }

    static func peerCredentials(_ conn: Connection) -> PeerCredentials? {
        var fd: uv_os_fd_t = -1
        guard uv_fileno(conn.handle, &fd) == 0 else { return nil }
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
        guard concord_peer_credentials(fd, &pid, &uid, &gid) == 0 else { return nil }
        return PeerCredentials(pid: pid, uid: uid, gid: gid)
    }

    private func noteAcceptFailure(_ status: Int32) {
        if acceptFailures == 0 {
            logger.error("cannot accept connections; retrying as they arrive", metadata: [
                "concord.error": "\(uvErrorName(Int(status)))",
                "concord.connections": "\(connections.count)",
            ])
        }
        acceptFailures += 1
    }

    fileprivate static func serverOf(connectionHandle h: UnsafeMutablePointer<uv_handle_t>) -> Server {
        let loop = uv_handle_get_loop(h)!
        return Unmanaged<Server>.fromOpaque(uv_loop_get_data(loop)!).takeUnretainedValue()
    }

    // MARK: Flow control (reading)

    /// Reads the connection while the core keeps up with it, its output
    /// drains, the inbox has room and the unfinished-line budget allows;
    /// stops reading it otherwise. Never drops anything: a stopped
    /// connection's bytes wait in the kernel and its peer's writes block.
    private func updateReading(_ conn: Connection) {
        guard !conn.closing else { return }
        let want = !shuttingDown && !conn.closeWhenFlushed
            && conn.flow.unsent.load(ordering: .relaxed) <= configuration.engine.outputSoftBytes
            && conn.flow.unprocessed.load(ordering: .relaxed) <= configuration.maxInputBytes
            && sequencer.inboxBytes.load(ordering: .relaxed) <= configuration.maxInboxBytes
            && lineBudgetAllows(conn)
        if want == conn.reading { return }
        if want {
            stalled[conn.id] = nil
            conn.reading = true
            uv_read_start(conn.stream, { h, _, buf in
                let server = Server.serverOf(connectionHandle: h!)
                buf!.pointee = uv_buf_t(base: server.readBuffer.assumingMemoryBound(to: CChar.self), len: 1 << 16)
            }, { stream, nread, buf in
                let conn = Unmanaged<Connection>.fromOpaque(uv_handle_get_data(asHandle(stream!))!).takeUnretainedValue()
                let server = Server.serverOf(connectionHandle: asHandle(stream!))
                server.read(conn, nread: nread, base: buf?.pointee.base)
            })
        } else {
            conn.reading = false
            uv_read_stop(conn.stream)
            if !shuttingDown { stalled[conn.id] = conn }
        }
    }

    /// Over the unfinished-line budget, one connection at a time (the grant
    /// holder) may go on growing its line, so some line always completes.
    private func lineBudgetAllows(_ conn: Connection) -> Bool {
        if conn.unfinished == 0 || unfinishedTotal <= configuration.maxUnfinishedLineBytes { return true }
        if lineGrant == nil { lineGrant = conn.id }
        return lineGrant == conn.id
    }

    private func recheckStalled() {
        guard !stalled.isEmpty else { return }
        for conn in Array(stalled.values) { updateReading(conn) }
    }

    private func read(_ conn: Connection, nread: Int, base: UnsafeMutablePointer<CChar>?) {
        if nread < 0 {
            let reason = nread == Int(UV_EOF.rawValue) ? "closed by peer" : uvErrorName(nread)
            closeConnection(conn, reason: reason)
            return
        }
        guard nread > 0, let base else { return }
        var frames: [LineFramer.Frame] = []
        var bytes = 0
        conn.framer.feed(UnsafeRawBufferPointer(start: base, count: nread)) { f in
            bytes += Sequencer.frameBytes(f)
            frames.append(f)
        }
        if !frames.isEmpty {
            conn.flow.unprocessed.add(bytes, ordering: .relaxed)
            sequencer.inboxBytes.add(bytes, ordering: .relaxed)
            sequencer.submit(.frames(conn.id, frames, bytes: bytes, readAt: monotonicSeconds()))
        }
        let unfinished = conn.framer.bufferedBytes
        if unfinished != conn.unfinished {
            unfinishedTotal += unfinished - conn.unfinished
            conn.unfinished = unfinished
            if unfinished == 0 && lineGrant == conn.id {
                lineGrant = nil
                updateReading(conn)
                recheckStalled()
                return
            }
        }
        updateReading(conn)
    }

    private func closeConnection(_ conn: Connection, reason: String) {
        guard !conn.closing else { return }
        conn.closing = true
        connections[conn.id] = nil
        stalled[conn.id] = nil
        unfinishedTotal -= conn.unfinished
        conn.unfinished = 0
        if lineGrant == conn.id { lineGrant = nil }
        conn.queued = []
        conn.queuedBytes = 0
        sequencer.submit(.close(conn.id))
        logger.info("connection closed", metadata: ["concord.conn.id": "\(conn.id)", "concord.reason": "\(reason)"])
        uv_close(conn.handle) { h in
            let conn = Unmanaged<Connection>.fromOpaque(uv_handle_get_data(h!)!).takeRetainedValue()
            conn.pipe.deallocate()
        }
        recheckStalled()
        checkDescriptorsFreed()
        maybeFinish()
    }

    // MARK: Output

    fileprivate func deliveriesArrived() {
        var tookInput = false
        for d in bridge.take() {
            for (id, segments) in d.outputs {
                guard let conn = connections[id], !conn.closing else { continue }
                var n = 0
                for s in segments { n += s.count }
                if conn.closeWhenFlushed && !shuttingDown {
                    // Over the hard limit: nothing more is queued for it.
                    conn.flow.unsent.subtract(n, ordering: .relaxed)
                    continue
                }
                conn.queued.append(contentsOf: segments)
                conn.queuedBytes += n
                if conn.inFlight == nil { writeQueued(conn) }
                checkOutput(conn)
            }
            if !d.mutationsReadAt.isEmpty {
                let now = monotonicSeconds()
                for t in d.mutationsReadAt { metrics.latency.recordNanoseconds(Int64(max(0, now - t) * 1e9)) }
            }
            for (token, text) in d.metrics { metricsEndpoint?.respond(token: token, text: text) }
            if d.inputTaken { tookInput = true }
            if d.drained { startClosing() }
        }
        if tookInput { recheckStalled() }
    }

    /// Starts one vectored write of everything queued.
    private func writeQueued(_ conn: Connection) {
        guard conn.inFlight == nil, !conn.queued.isEmpty, !conn.closing else { return }
        let ctx = WriteContext(connection: conn, segments: conn.queued)
        conn.queued = []
        conn.queuedBytes = 0
        let req = UnsafeMutablePointer<uv_write_t>.allocate(capacity: 1)
        req.pointee.data = Unmanaged.passRetained(ctx).toOpaque()
        let rc = uv_write(req, conn.stream, ctx.bufs, UInt32(ctx.segments.count)) { req, status in
            let ctx = Unmanaged<WriteContext>.fromOpaque(req!.pointee.data).takeRetainedValue()
            req!.deallocate()
            let conn = ctx.connection
            conn.inFlight = nil
            conn.flow.unsent.subtract(ctx.byteCount, ordering: .relaxed)
            guard !conn.closing else { return }
            let server = Server.serverOf(connectionHandle: conn.handle)
            if status >= 0 { server.metrics.bytesOut.increment(by: ctx.byteCount) }
            if status < 0 {
                server.closeConnection(conn, reason: "write failed: \(uvErrorName(Int(status)))")
                return
            }
            server.writeQueued(conn)
            server.checkOutput(conn)
        }
        if rc < 0 {
            Unmanaged<WriteContext>.fromOpaque(req.pointee.data).release()
            req.deallocate()
            closeConnection(conn, reason: "write failed: \(uvErrorName(Int(rc)))")
            return
        }
        conn.inFlight = ctx
    }

    /// After every write and delivery: the hard limit, the end of a coalescing
    /// episode, reading again, closing once flushed.
    private func checkOutput(_ conn: Connection) {
        guard !conn.closing else { return }
        if conn.closeWhenFlushed {
            if conn.inFlight == nil && conn.queued.isEmpty { closeConnection(conn, reason: conn.closeReason) }
            return
        }
        let unsent = conn.unsentNow
        if unsent > configuration.maxOutputBytes {
            // What cannot be coalesced (responses, view-ending events) is over
            // the hard limit. Drop what no write has started, let the write in
            // flight finish (it holds whole lines), then close.
            logger.warning("disconnecting a client that stopped reading", metadata: [
                "concord.conn.id": "\(conn.id)", "concord.unsent_bytes": "\(unsent)",
                "concord.max_output_bytes": "\(configuration.maxOutputBytes)",
            "concord.output_soft_bytes": "\(configuration.engine.outputSoftBytes)",
            "concord.max_input_bytes": "\(configuration.maxInputBytes)",
            "concord.max_inbox_bytes": "\(configuration.maxInboxBytes)",
            ])
            conn.flow.unsent.subtract(conn.queuedBytes, ordering: .relaxed)
            conn.queued = []
            conn.queuedBytes = 0
            conn.closeWhenFlushed = true
            conn.closeReason = "output limit exceeded"
            updateReading(conn)
            if conn.inFlight == nil { closeConnection(conn, reason: conn.closeReason) }
            startOverflowTimer()
            return
        }
        let episode = conn.flow.coalescing.load(ordering: .relaxed)
        if episode != 0 && episode != conn.drainReported
            && conn.flow.unsent.load(ordering: .relaxed) <= configuration.engine.outputSoftBytes / 2 {
            conn.drainReported = episode
            sequencer.submit(.drained(conn.id, episode: episode))
        }
        updateReading(conn)
    }

    /// A client over the hard limit that never reads would keep its last write
    /// in flight forever: after a grace period it is closed anyway.
    private func startOverflowTimer() {
        guard overflowTimer == nil else { return }
        let t = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
        uv_timer_init(loop, t)
        uv_handle_set_data(asHandle(t), Unmanaged.passUnretained(self).toOpaque())
        uv_timer_start(t, { h in
            let server = Server.from(h)
            var waiting = false
            for conn in Array(server.connections.values) where conn.closeWhenFlushed && !server.shuttingDown {
                conn.overflowTicks += 1
                if conn.overflowTicks >= 5 { server.closeConnection(conn, reason: "output limit exceeded (not reading)") } else { waiting = true }
            }
            if !waiting, let t = server.overflowTimer {
                uv_timer_stop(t)
                uv_close(asHandle(t)) { h in h?.deallocate() }
                server.overflowTimer = nil
            }
        }, 1000, 1000)
        overflowTimer = t
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
        metricsEndpoint?.close()
        // Nothing more is read: what was read is answered (the core drains it).
        for conn in connections.values where conn.reading {
            conn.reading = false
            uv_read_stop(conn.stream)
        }
        stalled = [:]
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
            if conn.inFlight == nil && conn.queued.isEmpty {
                closeConnection(conn, reason: "server shutdown")
            } else {
                conn.closeWhenFlushed = true
                conn.closeReason = "server shutdown"
            }
        }
        maybeFinish()
    }

    private func maybeFinish() {
        guard drained, connections.isEmpty, !finished else { return }
        finished = true
        for t in [drainTimer, overflowTimer].compactMap({ $0 }) {
            uv_timer_stop(t)
            uv_close(asHandle(t)) { h in h?.deallocate() }
        }
        drainTimer = nil
        overflowTimer = nil
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

/// Counting a directory's entries without Foundation.
enum FileManagerLite {
    static func countEntries(_ path: String) throws -> Int {
        guard let d = opendir(path) else { throw StartupError(description: "cannot open \(path)") }
        defer { closedir(d) }
        var n = 0
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != "." && name != ".." { n += 1 }
        }
        return n - 1  // the directory stream's own descriptor
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
