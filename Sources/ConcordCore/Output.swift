import ConcordJSON

/// Immutable bytes shared by every connection that sends them.
///
/// An event payload encoded once for a view value is one `OutputBytes`; each
/// subscriber's connection queues a reference to it, never a copy. The bytes
/// follow the object in the same allocation (one malloc, not two: a
/// connection takes a new block every take or two, so at 100 subscribers
/// that was ~100 mallocs an update) and never move, so the event loop can
/// hand the pointer to `uv_write` and keep the object alive until the write
/// completes.
///
/// An ``OutputQueue``'s block is one too: the queue writes it front to back,
/// and hands out chunks only of bytes already written, which it never
/// writes again (so the loop reads bytes the sequencer no longer touches).
public final class OutputBytes: ManagedBuffer<Int, UInt8> {
    // Shared across threads (see `OutputChunk`): a byte is written once
    // (when made, or by the one queue that owns a block, before it hands
    // the byte out) and only read afterwards.

    /// How many bytes (the header).
    @inline(__always)
    public var count: Int { header }

    /// Where they are: inside the object, fixed for its lifetime.
    @inline(__always)
    public var base: UnsafeMutableRawPointer {
        withUnsafeMutablePointerToElements { UnsafeMutableRawPointer($0) }
    }

    public var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: count) }

    /// A copy of `bytes`.
    public static func copy(_ bytes: [UInt8]) -> OutputBytes {
        let b = block(capacity: bytes.count)
        bytes.withUnsafeBytes { src in
            if let s = src.baseAddress { b.base.copyMemory(from: s, byteCount: src.count) }
        }
        return b
    }

    /// An unwritten block of `capacity` bytes (``OutputQueue``).
    static func block(capacity: Int) -> OutputBytes {
        unsafeDowncast(create(minimumCapacity: max(capacity, 1)) { _ in capacity }, to: OutputBytes.self)
    }
}

/// The decimal digits of a number ≥ 0 (a seq), right-aligned in 24 bytes
/// on the stack.
struct Digits {
    private var bytes: (UInt64, UInt64, UInt64) = (0, 0, 0)
    private(set) var count = 0

    @inline(__always)
    init(_ value: Int) {
        var v = UInt64(value), n = 0
        withUnsafeMutableBytes(of: &bytes) { d in
            repeat {
                d[23 - n] = 0x30 + UInt8(v % 10)
                v /= 10
                n += 1
            } while v > 0
        }
        count = n
    }

    @inline(__always)
    func copy(to p: UnsafeMutableRawPointer) {
        var b = bytes
        let n = count
        withUnsafeBytes(of: &b) { d in p.copyMemory(from: d.baseAddress! + 24 - n, byteCount: n) }
    }
}

/// A run of bytes to write: a slice of an ``OutputBytes`` (which it keeps alive).
public struct OutputChunk: Sendable {
    // `OutputBytes` is a `ManagedBuffer`, which the standard library marks
    // not Sendable (a subclass cannot say otherwise). Its bytes are written
    // before a chunk of them exists and only read afterwards.
    public nonisolated(unsafe) let owner: OutputBytes
    public let offset: Int
    public let count: Int

    public var base: UnsafeRawPointer { UnsafeRawPointer(owner.base + offset) }
}

/// What one connection is to be sent, in order: its own bytes (responses,
/// event headers, small payloads) interleaved with shared payloads.
///
/// The connection's own bytes are written into blocks it owns (malloc'ed
/// once, never moved, never copied again): `take()` hands out chunks of the
/// bytes written since the last take, and the queue goes on filling the
/// same block after them. So a fan-out's events are copied once, into the
/// block, however many takes they span; shared payloads above `copyLimit`
/// are referenced, never copied. Blocks grow (doubling, up to `maxBlock`)
/// while a connection fills more than one between takes, and shrink again
/// (halving, down to `minBlock`) while it queues little: at a take a block
/// is let go when little of it is left or when it is more than twice the
/// size the traffic now calls for, so a quiet connection holds at most a
/// small, partly used block.
public struct OutputQueue {
    /// The block being written: bytes `0..<filled` are written; `runStart..<filled` not yet handed out.
    private var block: OutputBytes? = nil
    /// `block`'s bytes and size, kept beside it: finding room in the block
    /// (every event of a fan-out) then reads neither the object nor its
    /// reference count.
    private var blockBase: UnsafeMutableRawPointer? = nil
    private var blockSize = 0
    private var filled = 0
    private var runStart = 0
    /// The size of the next block (grows while blocks fill up between takes).
    private var nextBlock = OutputQueue.minBlock
    /// Chunks closed since the last take, in order.
    private var parts: [OutputChunk] = []
    /// A writer's buffer reused by `write` (kept only while small).
    private var scratch: [UInt8] = []
    public private(set) var byteCount = 0
    /// Complete lines (responses and events) queued since the last `take()`.
    public private(set) var lineCount = 0

    static let minBlock = 256
    static let maxBlock = 64 << 10
    /// `write`'s buffer is kept for the next write while at most this big.
    static let scratchLimit = 1024

    public init() {}

    public var isEmpty: Bool { parts.isEmpty && filled == runStart }

    /// The block being written's size (0: none), for tests of the sizing.
    var blockCapacity: Int { block?.count ?? 0 }

    /// Room for `n` more bytes in the block: where to write them.
    @inline(__always)
    private mutating func space(_ n: Int) -> UnsafeMutableRawPointer {
        if let base = blockBase, blockSize &- filled >= n { return base + filled }
        return newBlock(n)
    }

    private mutating func newBlock(_ n: Int) -> UnsafeMutableRawPointer {
        closeRun()
        if block != nil { nextBlock = min(nextBlock * 2, Self.maxBlock) }
        let b = OutputBytes.block(capacity: max(n, nextBlock))
        block = b
        blockBase = b.base
        blockSize = b.count
        filled = 0
        runStart = 0
        return b.base
    }

    @inline(__always)
    private mutating func copy(_ src: UnsafeRawBufferPointer) {
        guard let from = src.baseAddress, src.count > 0 else { return }
        space(src.count).copyMemory(from: from, byteCount: src.count)
        filled += src.count
        byteCount += src.count
    }

    mutating func append(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { copy($0) }
        if bytes.last == 0x0A { lineCount += 1 }
    }

    /// Writes with a `JSONWriter`, then copies what it wrote into the block.
    mutating func write(_ body: (inout JSONWriter) -> Void) {
        var w = JSONWriter(adopting: scratch)
        scratch = []
        body(&w)
        w.bytes.withUnsafeBytes { copy($0) }
        if w.bytes.last == 0x0A { lineCount += 1 }
        if w.bytes.capacity <= Self.scratchLimit {
            w.bytes.removeAll(keepingCapacity: true)
            scratch = w.bytes
        }
    }

    /// One event of a fan-out: `head` (`{"event":"…","sub":`), the
    /// subscription's name, `tail` (`,"seq":N` and the payload) — the two
    /// parts every subscriber shares, written once for all of them.
    mutating func appendEvent(head: UnsafeRawBufferPointer, _ s: SubscriptionRecord, tail: UnsafeRawBufferPointer) {
        guard s.nameIsPlain else {
            var name: [UInt8] = []
            s.appendName(to: &name)
            copy(head)
            name.withUnsafeBytes { copy($0) }
            copy(tail)
            if tail.last == 0x0A { lineCount += 1 }
            return
        }
        let nameCount = s.nameCount
        let total = head.count + nameCount + 2 + tail.count
        var p = space(total)
        p.copyMemory(from: head.baseAddress!, byteCount: head.count)
        p += head.count
        p = s.copyQuotedName(to: p, nameCount)
        p.copyMemory(from: tail.baseAddress!, byteCount: tail.count)
        filled += total
        byteCount += total
        if tail.last == 0x0A { lineCount += 1 }
    }

    /// An event's header, `{"event":"…","sub":"…","seq":N`, written straight
    /// into the block when the name needs no escaping (the usual case: no
    /// writer, no scratch copy); false, and nothing written, otherwise.
    mutating func appendEventHeader(_ event: StaticString, _ s: SubscriptionRecord, seq: Int) -> Bool {
        guard s.nameIsPlain, seq >= 0 else { return false }
        let digits = Digits(seq)
        let n = digits.count
        let open: StaticString = "{\"event\":\"", sub: StaticString = "\",\"sub\":", seqName: StaticString = ",\"seq\":"
        let nameCount = s.nameCount
        let total = open.utf8CodeUnitCount + event.utf8CodeUnitCount + sub.utf8CodeUnitCount + nameCount + 2
            + seqName.utf8CodeUnitCount + n
        var p = space(total)
        @inline(__always) func put(_ from: UnsafeRawPointer?, _ count: Int) {
            if count > 0, let from { p.copyMemory(from: from, byteCount: count) }
            p += count
        }
        put(open.utf8Start, open.utf8CodeUnitCount)
        put(event.utf8Start, event.utf8CodeUnitCount)
        put(sub.utf8Start, sub.utf8CodeUnitCount)
        p = s.copyQuotedName(to: p, nameCount)
        put(seqName.utf8Start, seqName.utf8CodeUnitCount)
        digits.copy(to: p)
        filled += total
        byteCount += total
        return true
    }

    /// A mutation's response without a `rid`, `{"rid":null,"ok":true,"seq":N}`,
    /// straight into the block (through a `JSONWriter` it cost ~1,000
    /// instructions, every mutation).
    mutating func appendResponse(seq: Int) {
        let open: StaticString = "{\"rid\":null,\"ok\":true,\"seq\":"
        let digits = Digits(seq)
        let total = open.utf8CodeUnitCount + digits.count + 2
        let p = space(total)
        p.copyMemory(from: open.utf8Start, byteCount: open.utf8CodeUnitCount)
        digits.copy(to: p + open.utf8CodeUnitCount)
        p.storeBytes(of: 0x7D, toByteOffset: total - 2, as: UInt8.self)
        p.storeBytes(of: 0x0A, toByteOffset: total - 1, as: UInt8.self)
        filled += total
        byteCount += total
        lineCount += 1
    }

    /// Shared payloads up to this size are copied into the connection's own
    /// bytes rather than referenced: a copy of a few hundred bytes costs less
    /// than a reference (retain, a part, an iovec, a release after the write).
    /// Measured with `concord-load core --subs 100` and concord-bench
    /// (docs/ARCHITECTURE.md, "Where the time and the bytes go").
    public static let copyLimit = 1024

    mutating func append(shared: OutputBytes) {
        if shared.count > 0, shared.base.load(fromByteOffset: shared.count - 1, as: UInt8.self) == 0x0A { lineCount += 1 }
        if shared.count <= Self.copyLimit {
            copy(UnsafeRawBufferPointer(start: shared.base, count: shared.count))
            return
        }
        byteCount += shared.count
        closeRun()
        parts.append(OutputChunk(owner: shared, offset: 0, count: shared.count))
    }

    private mutating func closeRun() {
        if filled > runStart, let b = block {
            parts.append(OutputChunk(owner: b, offset: runStart, count: filled - runStart))
            runStart = filled
        }
    }

    /// Everything queued so far, in order; the queue is empty afterwards.
    public mutating func take() -> [OutputChunk] {
        var out: [OutputChunk] = []
        take(into: &out)
        return out
    }

    /// `take()` into `list`, which must be empty: the two trade storage, so
    /// the queue goes on filling the list's (a spare with room: no allocation
    /// for the next take's chunks) and `list` holds what was taken.
    public mutating func take(into list: inout [OutputChunk]) {
        precondition(list.isEmpty, "OutputQueue.take(into:) needs an empty list")
        closeRun()
        swap(&parts, &list)
        // A quiet period (little queued since the last take): the next block
        // is smaller; a block too big for the traffic now is let go.
        if byteCount < nextBlock / 4 { nextBlock = max(Self.minBlock, nextBlock / 2) }
        if let b = block, b.count - filled < b.count / 4 || b.count > 2 * nextBlock {
            // The chunks keep it alive until written; the next bytes start a new block.
            block = nil
            blockBase = nil
            blockSize = 0
            filled = 0
            runStart = 0
        }
        byteCount = 0
        lineCount = 0
    }
}
