import CConcordRuntime
import CLibUV
import ConcordCore
import ConcordJSON
import CoreMetrics
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

extension Server {
    // MARK: Connections

    func accept(status: Int32) {
        guard !shuttingDown else { return }
        guard status >= 0 else {
            // EMFILE/ENFILE: libuv has already accepted and closed the pending
            // connection (its reserve-fd trick). Log once per episode.
            noteAcceptFailure(status)
            return
        }
        let p = UnsafeMutablePointer<uv_pipe_t>.allocate(capacity: 1)
        uvMust("uv_pipe_init", uv_pipe_init(loop, p, 0))
        do {
            try uvCall("uv_accept", uv_accept(asStream(listener!), asStream(p)))
        } catch {
            noteAcceptFailure(error.code)
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
    func isAllowed(_ peer: PeerCredentials?) -> Bool {
        if configuration.allowUIDs.isEmpty && configuration.allowGIDs.isEmpty { return true }
        guard let peer else { return false }
        return peer.uid == getuid() || configuration.allowUIDs.contains(peer.uid) || configuration.allowGIDs.contains(peer.gid)
    }

    /// One `forbidden` line (the socket buffer of a new connection takes it
    /// whole), then close. Nothing reaches the core.
    func refuse(_ conn: Connection, peer: PeerCredentials?) {
        metrics.connectionsRefused.increment()
        metrics.forbidden.add(1, ordering: .relaxed)
        let who = peer.map { "uid \($0.uid) gid \($0.gid) (pid \($0.pid))" } ?? "a peer with unknown credentials"
        noteRefusal(peer)
        let line = #"{"ok":false,"error":{"code":"forbidden","message":"#
        var w = JSONWriter(capacity: 160)
        w.string("\(who) may not use this server: it allows only the uids and gids given with --allow-uid/--allow-gid")
        var bytes = Array(line.utf8) + w.bytes + Array("}}\n".utf8)
        bytes.withUnsafeMutableBytes { raw in
            var buf = uv_buf_t(base: raw.baseAddress!.assumingMemoryBound(to: CChar.self), len: raw.count)
            // Best effort: a peer whose buffer cannot take one line gets only the close.
            _ = try? uvCall("uv_try_write", uv_try_write(conn.stream, &buf, 1))
        }
        uv_handle_set_data(conn.handle, Unmanaged.passRetained(conn).toOpaque())
        connections[conn.id] = nil
        uv_close(conn.handle) { h in
            let conn = Unmanaged<Connection>.fromOpaque(uv_handle_get_data(h!)!).takeRetainedValue()
            conn.pipe.deallocate()
        }
    }

    /// One log line per refused peer (by uid) per episode of 10 s, then one
    /// line with the count of the refusals it did not log: a peer that
    /// reconnects in a loop cannot flood the log.
    func noteRefusal(_ peer: PeerCredentials?) {
        let uid = peer?.uid ?? UInt32.max
        let now = monotonicSeconds()
        if var episode = refusals[uid] {
            episode.count += 1
            if now - episode.since < 10 {
                refusals[uid] = episode
                return
            }
            logger.warning("connections refused: peer not allowed (repeated)", metadata: [
                "concord.peer.uid": "\(peer.map { String($0.uid) } ?? "?")",
                "concord.refused": "\(episode.count)", "concord.seconds": "\(Int(now - episode.since))",
            ])
            refusals[uid] = (0, now)
            return
        }
        if refusals.count >= 1024 { refusals.removeAll() }  // bounded, whoever knocks
        refusals[uid] = (0, now)
        logger.warning("connection refused: peer not allowed", metadata: [
            "concord.peer.uid": "\(peer.map { String($0.uid) } ?? "?")", "concord.peer.gid": "\(peer.map { String($0.gid) } ?? "?")",
            "concord.peer.pid": "\(peer.map { String($0.pid) } ?? "?")",
        ])
    }

    /// After a close: the end of a descriptor-limit episode.
    func checkDescriptorsFreed() {
        if atDescriptorLimit && fdBaseline + connections.count + 2 < fdLimit {
            atDescriptorLimit = false
            logger.notice("accepting connections again", metadata: ["concord.connections": "\(connections.count)"])
        }
    }

    static func peerCredentials(_ conn: Connection) -> PeerCredentials? {
        var fd: uv_os_fd_t = -1
        guard (try? uvCall("uv_fileno", uv_fileno(conn.handle, &fd))) != nil else { return nil }
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
        guard concord_peer_credentials(fd, &pid, &uid, &gid) == 0 else { return nil }
        return PeerCredentials(pid: pid, uid: uid, gid: gid)
    }

    func noteAcceptFailure(_ status: Int32) {
        if acceptFailures == 0 {
            logger.error("cannot accept connections; retrying as they arrive", metadata: [
                "concord.error": "\(uvErrorName(Int(status)))",
                "concord.connections": "\(connections.count)",
            ])
        }
        acceptFailures += 1
    }

    static func serverOf(connectionHandle h: UnsafeMutablePointer<uv_handle_t>) -> Server {
        let loop = uv_handle_get_loop(h)!
        return Unmanaged<Server>.fromOpaque(uv_loop_get_data(loop)!).takeUnretainedValue()
    }
}
