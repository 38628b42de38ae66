import CLibUV
import ConcordCore
import Logging

#if canImport(Glibc)
import Glibc
#endif

extension Server {
    // MARK: Shutdown

    func beginShutdown(signal signum: Int32) {
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
            uvMust("uv_read_stop", uv_read_stop(conn.stream))
        }
        stalled = [:]
        sequencer.submit(.shutdown)
    }

    /// The core has answered everything read before the signal: flush and close.
    func startClosing() {
        drained = true
        // A client that never reads must not hold the shutdown forever.
        let t = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
        uvMust("uv_timer_init", uv_timer_init(loop, t))
        uv_handle_set_data(asHandle(t), Unmanaged.passUnretained(self).toOpaque())
        uvMust("uv_timer_start", uv_timer_start(t, { h in
            let server = Server.from(h)
            for conn in Array(server.connections.values) { server.closeConnection(conn, reason: "shutdown timeout") }
        }, 3000, 0))
        drainTimer = t
        for conn in Array(connections.values) {
            if !conn.writing && conn.queued.isEmpty {
                closeConnection(conn, reason: "server shutdown")
            } else {
                conn.closeWhenFlushed = true
                conn.closeReason = "server shutdown"
            }
        }
        maybeFinish()
    }

    func maybeFinish() {
        guard drained, connections.isEmpty, !finished else { return }
        finished = true
        for t in [drainTimer, overflowTimer].compactMap({ $0 }) {
            uvMust("uv_timer_stop", uv_timer_stop(t))
            uv_close(asHandle(t)) { h in h?.deallocate() }
        }
        drainTimer = nil
        overflowTimer = nil
        for s in signalHandles {
            uvMust("uv_signal_stop", uv_signal_stop(s))
            uv_close(asHandle(s)) { h in h?.deallocate() }
        }
        signalHandles = []
        clusterLink?.close()
        bridge.close()
        uv_poll_stop(wakeHandle)
        uv_close(asHandle(wakeHandle), nil)
    }
}
