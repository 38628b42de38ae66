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
    /// The one write in flight (whole lines only, so a close never cuts a
    /// line): its chunks, kept alive until libuv is done with them, and their
    /// bytes. `queued` and `inFlight` trade storage at each write, so a
    /// connection that writes steadily allocates no list per write.
    var inFlight: [OutputChunk] = []
    var inFlightBytes = 0
    var writing = false
    /// That write's request and buffer list: one per connection, reused (the
    /// list grows to the most chunks one write has had).
    let writeRequest = UnsafeMutablePointer<uv_write_t>.allocate(capacity: 1)
    private(set) var bufs = UnsafeMutablePointer<uv_buf_t>.allocate(capacity: 4)
    private var bufsCapacity = 4
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

    /// Moves the queue into the write in flight and points `bufs` at its chunks.
    func beginWrite() {
        swap(&inFlight, &queued)
        inFlightBytes = queuedBytes
        queuedBytes = 0
        if inFlight.count > bufsCapacity {
            bufs.deallocate()
            bufsCapacity = inFlight.count
            bufs = .allocate(capacity: bufsCapacity)
        }
        for i in inFlight.indices {
            let s = inFlight[i]
            bufs[i] = uv_buf_t(base: UnsafeMutablePointer(mutating: s.base.assumingMemoryBound(to: CChar.self)), len: s.count)
        }
        writing = true
    }

    /// The write in flight is over (done, failed or cancelled): its chunks
    /// go (their blocks are freed), the list's storage stays unless a
    /// backlog made it long.
    func endWrite() {
        writing = false
        inFlight.drain(keepingAtMost: 1024)
        if bufsCapacity > 1024 {
            bufs.deallocate()
            bufsCapacity = 4
            bufs = .allocate(capacity: bufsCapacity)
        }
    }

    deinit {
        writeRequest.deallocate()
        bufs.deallocate()
    }
}
