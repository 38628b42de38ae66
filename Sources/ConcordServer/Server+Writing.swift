import CLibUV
import ConcordCore
import CoreMetrics
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

extension Server {
    // MARK: Output

    /// A delivery's outputs up to this size are written before the larger ones.
    static let smallOutput = 4096

    func deliveriesArrived() {
        var tookInput = false
        var taken: [Sequencer.Delivery] = []
        swap(&taken, &deliveryScratch)
        defer {
            taken.drain(keepingAtMost: 64)
            swap(&taken, &deliveryScratch)
        }
        bridge.take(into: &taken, exchanging: &spares)
        for di in taken.indices {
            // Small outputs first (a response, a few events), then the rest:
            // writes go out in this order, and a ping's answer should not
            // wait behind a fan-out's hundreds of kilobytes to other readers.
            var large: [(output: Int, bytes: Int)] = []
            for oi in taken[di].outputs.indices {
                var n = 0
                for s in taken[di].outputs[oi].1 { n += s.count }
                if n <= Self.smallOutput {
                    queueOutput(taken[di].outputs[oi].0, &taken[di].outputs[oi].1, n)
                } else {
                    large.append((oi, n))
                }
            }
            for (oi, n) in large { queueOutput(taken[di].outputs[oi].0, &taken[di].outputs[oi].1, n) }
            if !taken[di].mutationsReadAt.isEmpty {
                metrics.latency.record(since: taken[di].mutationsReadAt, now: monotonicSeconds())
            }
            for (token, text) in taken[di].metrics { metricsEndpoint?.respond(token: token, text: text) }
            if taken[di].clusterReady { clusterReady() }
            if taken[di].clusterResyncWanted { clusterLink?.resync() }
            if !taken[di].clusterAppends.isEmpty { clusterLink?.append(taken[di].clusterAppends) }
            if taken[di].clusterHeadWanted { clusterLink?.fetchHead() }
            if let snap = taken[di].clusterSnapshot { clusterLink?.snapshotTaken(snap.bytes, offset: snap.offset, streamID: snap.streamID, sum: snap.sum) }
            if taken[di].inputTaken { tookInput = true }
            if taken[di].drained { startClosing() }
            // Its lists go back to the sequencer, emptied (the connections'
            // queues traded theirs for them), at the next hand-off.
            for oi in taken[di].outputs.indices { SpareLists.keep(&taken[di].outputs[oi].1, in: &spares.chunks) }
            SpareLists.keep(&taken[di].outputs, in: &spares.outputs)
            SpareLists.keep(&taken[di].mutationsReadAt, in: &spares.stamps)
        }
        if tookInput { recheckStalled() }
    }

    /// Queues a delivery's `n` bytes for connection `id` and starts its write.
    /// The chunks are taken from `segments` (into an empty queue by trading
    /// lists: no copy of the chunks, no retain and release of each).
    private func queueOutput(_ id: ConnectionID, _ segments: inout [OutputChunk], _ n: Int) {
        guard let conn = connections[id], !conn.closing else { return }
        if conn.closeWhenFlushed && !shuttingDown {
            // Over the hard limit: nothing more is queued for it.
            conn.flow.unsent.subtract(n, ordering: .relaxed)
            return
        }
        if conn.queued.isEmpty { swap(&conn.queued, &segments) } else { conn.queued.append(contentsOf: segments) }
        conn.queuedBytes += n
        if !conn.writing { writeQueued(conn) }
        checkOutput(conn)
    }

    /// Writes everything queued: first straight to the socket
    /// (`uv_try_write`), then what it did not take as one vectored write
    /// request. A request that completes at once still costs a callback in
    /// the loop's next iteration and an `epoll_ctl` (libuv re-arms the
    /// watcher when its write queue drains); most writes fit the socket's
    /// buffer and need neither.
    func writeQueued(_ conn: Connection) {
        guard !conn.writing, !conn.queued.isEmpty, !conn.closing else { return }
        conn.beginWrite()
        let written = Int(uv_try_write(conn.stream, conn.bufs, UInt32(conn.inFlight.count)))
        if written == conn.inFlightBytes {
            conn.endWrite()
            conn.flow.unsent.subtract(written, ordering: .relaxed)
            metrics.bytesOut.increment(by: written)
            return
        }
        var first = 0
        if written > 0 {
            // The socket took part of it: the request writes the rest.
            conn.flow.unsent.subtract(written, ordering: .relaxed)
            metrics.bytesOut.increment(by: written)
            conn.inFlightBytes -= written
            var skip = written
            while skip >= conn.bufs[first].len {
                skip -= conn.bufs[first].len
                first += 1
            }
            conn.bufs[first].base += skip
            conn.bufs[first].len -= skip
        } else if written != Int(UV_EAGAIN.rawValue) {
            conn.flow.unsent.subtract(conn.inFlightBytes, ordering: .relaxed)
            conn.endWrite()
            closeConnection(conn, reason: "write failed: \(uvErrorName(written))")
            return
        }
        let req = conn.writeRequest
        // The connection is kept until the callback (which libuv calls, with
        // UV_ECANCELED, also when the connection closes first).
        req.pointee.data = Unmanaged.passRetained(conn).toOpaque()
        let rc = uv_write(req, conn.stream, conn.bufs + first, UInt32(conn.inFlight.count - first)) { req, status in
            let conn = Unmanaged<Connection>.fromOpaque(req!.pointee.data).takeRetainedValue()
            let bytes = conn.inFlightBytes
            conn.endWrite()
            conn.flow.unsent.subtract(bytes, ordering: .relaxed)
            guard !conn.closing else { return }
            let server = Server.serverOf(connectionHandle: conn.handle)
            if status >= 0 { server.metrics.bytesOut.increment(by: bytes) }
            if status < 0 {
                server.closeConnection(conn, reason: "write failed: \(uvErrorName(Int(status)))")
                return
            }
            server.writeQueued(conn)
            server.checkOutput(conn)
        }
        do {
            try uvCall("uv_write", rc)
        } catch {
            Unmanaged<Connection>.fromOpaque(req.pointee.data).release()
            conn.flow.unsent.subtract(conn.inFlightBytes, ordering: .relaxed)
            conn.endWrite()
            closeConnection(conn, reason: "write failed: \(error)")
            return
        }
    }

    /// After every write and delivery: the hard limit, the end of a coalescing
    /// episode, reading again, closing once flushed.
    func checkOutput(_ conn: Connection) {
        guard !conn.closing else { return }
        if conn.closeWhenFlushed {
            if !conn.writing && conn.queued.isEmpty { closeConnection(conn, reason: conn.closeReason) }
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
            if !conn.writing { closeConnection(conn, reason: conn.closeReason) }
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
    func startOverflowTimer() {
        guard overflowTimer == nil else { return }
        let t = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
        uvMust("uv_timer_init", uv_timer_init(loop, t))
        uv_handle_set_data(asHandle(t), Unmanaged.passUnretained(self).toOpaque())
        uvMust("uv_timer_start", uv_timer_start(t, { h in
            let server = Server.from(h)
            var waiting = false
            for conn in Array(server.connections.values) where conn.closeWhenFlushed && !server.shuttingDown {
                conn.overflowTicks += 1
                if conn.overflowTicks >= 5 { server.closeConnection(conn, reason: "output limit exceeded (not reading)") } else { waiting = true }
            }
            if !waiting, let t = server.overflowTimer {
                uvMust("uv_timer_stop", uv_timer_stop(t))
                uv_close(asHandle(t)) { h in h?.deallocate() }
                server.overflowTimer = nil
            }
        }, 1000, 1000))
        overflowTimer = t
    }
}
