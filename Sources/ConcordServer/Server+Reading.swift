import CLibUV
import ConcordCore
import ConcordProtocol
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

extension Server {
    // MARK: Flow control (reading)

    /// Reads the connection while the core keeps up with it, its output
    /// drains, the inbox has room and the unfinished-line budget allows;
    /// stops reading it otherwise. Never drops anything: a stopped
    /// connection's bytes wait in the kernel and its peer's writes block.
    func updateReading(_ conn: Connection) {
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
            do {
                try uvCall("uv_read_start", uv_read_start(conn.stream, { h, _, buf in
                    let server = Server.serverOf(connectionHandle: h!)
                    buf!.pointee = uv_buf_t(base: server.readBuffer.assumingMemoryBound(to: CChar.self), len: 1 << 16)
                }, { stream, nread, buf in
                    let conn = Unmanaged<Connection>.fromOpaque(uv_handle_get_data(asHandle(stream!))!).takeUnretainedValue()
                    let server = Server.serverOf(connectionHandle: asHandle(stream!))
                    server.read(conn, nread: nread, base: buf?.pointee.base)
                }))
            } catch {
                conn.reading = false
                closeConnection(conn, reason: "cannot read: \(error)")
            }
        } else {
            conn.reading = false
            uvMust("uv_read_stop", uv_read_stop(conn.stream))
            if !shuttingDown { stalled[conn.id] = conn }
        }
    }

    /// Over the unfinished-line budget, one connection at a time (the grant
    /// holder) may go on growing its line, so some line always completes.
    func lineBudgetAllows(_ conn: Connection) -> Bool {
        if conn.unfinished == 0 || unfinishedTotal <= configuration.maxUnfinishedLineBytes { return true }
        if lineGrant == nil { lineGrant = conn.id }
        return lineGrant == conn.id
    }

    func recheckStalled() {
        guard !stalled.isEmpty else { return }
        for conn in Array(stalled.values) { updateReading(conn) }
    }

    func read(_ conn: Connection, nread: Int, base: UnsafeMutablePointer<CChar>?) {
        if nread < 0 {
            let reason = nread == Int(UV_EOF.rawValue) ? "closed by peer" : uvErrorName(nread)
            closeConnection(conn, reason: reason)
            return
        }
        guard nread > 0, let base else { return }
        var frames = spares.frames.popLast() ?? []
        var bytes = 0
        conn.framer.feed(UnsafeRawBufferPointer(start: base, count: nread)) { f in
            bytes += Sequencer.frameBytes(f)
            frames.append(f)
        }
        if !frames.isEmpty {
            let now = monotonicSeconds()
            // A connection that was idle (nothing waiting at the sequencer,
            // nothing sent for a while) and sends a request or a few is a
            // newcomer there: a running turn makes way for it (Sequencer.arrivals).
            let newcomer = conn.flow.unprocessed.add(bytes, ordering: .relaxed).oldValue == 0
                && Sequencer.isNewcomer(lines: frames.count, idle: now - conn.lastSubmit)
            if newcomer { sequencer.arrivals.add(1, ordering: .relaxed) }
            conn.lastSubmit = now
            sequencer.inboxBytes.add(bytes, ordering: .relaxed)
            sequencer.submit(.frames(conn.id, frames, bytes: bytes, readAt: now, newcomer: newcomer))
        } else {
            SpareLists.keep(&frames, in: &spares.frames)
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

    func closeConnection(_ conn: Connection, reason: String) {
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
}
