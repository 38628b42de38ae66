import CLibUV
import ConcordCore
import ConcordProtocol

#if canImport(Glibc)
import Glibc
#endif

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
    /// When lines of it last went to the sequencer (monotonic seconds).
    var lastSubmit = -Double.infinity
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
