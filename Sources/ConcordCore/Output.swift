import ConcordJSON

/// Immutable bytes shared by every connection that sends them.
///
/// An event payload encoded once for a view value is one `OutputBytes`; each
/// subscriber's connection queues a reference to it, never a copy. The
/// storage is malloc'ed once and never moves, so the event loop can hand the
/// pointer to `uv_write` and keep the object alive until the write completes.
public final class OutputBytes: @unchecked Sendable {
    // Sendable: the bytes are written once in init and only read afterwards.
    public let base: UnsafeMutableRawPointer
    public let count: Int

    public init(_ bytes: [UInt8]) {
        count = bytes.count
        base = UnsafeMutableRawPointer.allocate(byteCount: max(count, 1), alignment: 1)
        bytes.withUnsafeBytes { src in
            if let s = src.baseAddress { base.copyMemory(from: s, byteCount: count) }
        }
    }

    deinit { base.deallocate() }

    public var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: count) }
}

/// A run of bytes to write: a slice of an ``OutputBytes`` (which it keeps alive).
public struct OutputChunk: Sendable {
    public let owner: OutputBytes
    public let offset: Int
    public let count: Int

    public var base: UnsafeRawPointer { UnsafeRawPointer(owner.base + offset) }
}

/// What one connection is to be sent, in order: its own small bytes
/// (responses, event headers) interleaved with shared payloads.
///
/// The connection's own bytes of one hand-off go into a single buffer (one
/// allocation, however many events); shared payloads are referenced, never
/// copied. `take()` turns both into chunks for one vectored write.
public struct OutputQueue {
    private var own: [UInt8] = []
    /// In order: a run of `own` (`shared == nil`, `start..<end`) or a shared payload.
    private var parts: [(shared: OutputBytes?, start: Int, end: Int)] = []
    private var runStart = 0
    public private(set) var byteCount = 0
    /// Complete lines (responses and events) queued since the last `take()`.
    public private(set) var lineCount = 0

    public init() {}

    public var isEmpty: Bool { parts.isEmpty && own.count == runStart }

    mutating func append(_ bytes: [UInt8]) {
        own.append(contentsOf: bytes)
        byteCount += bytes.count
        if bytes.last == 0x0A { lineCount += 1 }
    }

    /// Writes straight into the connection's own bytes (no temporary buffer).
    mutating func write(_ body: (inout JSONWriter) -> Void) {
        var w = JSONWriter(adopting: own)
        own = []
        let before = w.bytes.count
        body(&w)
        byteCount += w.bytes.count - before
        own = w.bytes
        if own.count > before, own.last == 0x0A { lineCount += 1 }
    }

    /// One event of a fan-out: `head` (`{"event":"…","sub":`), the
    /// subscription's name, `tail` (`,"seq":N` and the payload) — the two
    /// parts every subscriber shares, written once for all of them.
    mutating func appendEvent(head: [UInt8], _ s: SubscriptionRecord, tail: [UInt8]) {
        let before = own.count
        own.append(contentsOf: head)
        s.appendName(to: &own)
        own.append(contentsOf: tail)
        byteCount += own.count - before
        if tail.last == 0x0A { lineCount += 1 }
    }

    /// Shared payloads up to this size are copied into the connection's own
    /// bytes rather than referenced: a copy of a few hundred bytes costs less
    /// than a reference (retain, a part, an iovec, a release after the write).
    /// Measured with `concord-load core --subs 100` and concord-bench
    /// (docs/ARCHITECTURE.md, "Where the time and the bytes go").
    public static let copyLimit = 1024

    mutating func append(shared: OutputBytes) {
        byteCount += shared.count
        if shared.count > 0, shared.base.load(fromByteOffset: shared.count - 1, as: UInt8.self) == 0x0A { lineCount += 1 }
        if shared.count <= Self.copyLimit {
            own.append(contentsOf: UnsafeBufferPointer(start: shared.base.assumingMemoryBound(to: UInt8.self), count: shared.count))
            return
        }
        closeRun()
        parts.append((shared, 0, shared.count))
    }

    private mutating func closeRun() {
        if own.count > runStart {
            parts.append((nil, runStart, own.count))
            runStart = own.count
        }
    }

    /// Everything queued so far, in order; the queue is empty afterwards.
    public mutating func take() -> [OutputChunk] {
        closeRun()
        let arena = own.isEmpty ? nil : OutputBytes(own)
        var out: [OutputChunk] = []
        out.reserveCapacity(parts.count)
        for p in parts {
            if let shared = p.shared {
                out.append(OutputChunk(owner: shared, offset: 0, count: shared.count))
            } else if let arena {
                out.append(OutputChunk(owner: arena, offset: p.start, count: p.end - p.start))
            }
        }
        own.removeAll(keepingCapacity: true)
        parts.removeAll(keepingCapacity: true)
        runStart = 0
        byteCount = 0
        lineCount = 0
        return out
    }
}
