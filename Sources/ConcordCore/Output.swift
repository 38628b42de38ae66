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

/// What one connection is to be sent, in order: its own small bytes
/// (responses, event headers) interleaved with shared payloads.
public struct OutputQueue {
    public private(set) var segments: [OutputBytes] = []
    private var pending: [UInt8] = []
    public private(set) var byteCount = 0

    public init() {}

    public var isEmpty: Bool { segments.isEmpty && pending.isEmpty }

    mutating func append(_ bytes: [UInt8]) {
        pending.append(contentsOf: bytes)
        byteCount += bytes.count
    }

    /// Writes straight into the pending bytes (no temporary buffer).
    mutating func write(_ body: (inout JSONWriter) -> Void) {
        var w = JSONWriter(adopting: pending)
        pending = []
        let before = w.bytes.count
        body(&w)
        byteCount += w.bytes.count - before
        pending = w.bytes
    }

    mutating func append(shared: OutputBytes) {
        flushPending()
        segments.append(shared)
        byteCount += shared.count
    }

    private mutating func flushPending() {
        if !pending.isEmpty {
            segments.append(OutputBytes(pending))
            pending.removeAll(keepingCapacity: true)
        }
    }

    /// Everything queued so far, in order; the queue is empty afterwards.
    public mutating func take() -> [OutputBytes] {
        flushPending()
        let out = segments
        segments = []
        byteCount = 0
        return out
    }
}

/// Runs independent work items, possibly in parallel, and returns when all
/// are done. The core calls it with items that touch disjoint state.
public protocol ParallelExecutor: AnyObject {
    /// How many threads take part (1 means inline).
    var width: Int { get }
    /// Calls `body(i)` once for every `i` in `0..<count`, and returns when all are done.
    /// (`body` is escaping only so it can be handed to other threads; it is not kept.)
    func forEach(_ count: Int, _ body: @escaping (Int) -> Void)
}

/// Runs everything on the caller's thread (tests, `--threads 1`).
public final class InlineExecutor: ParallelExecutor {
    public init() {}
    public var width: Int { 1 }
    public func forEach(_ count: Int, _ body: @escaping (Int) -> Void) {
        for i in 0..<count { body(i) }
    }
}
