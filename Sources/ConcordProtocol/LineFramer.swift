#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Splits a byte stream into lines (PROTOCOL.md §1).
///
/// A line ends with `\n`; a `\r` before it is dropped. A line longer than
/// `maxLineBytes` (without its line ending) is reported once as
/// ``Frame/tooLarge`` as soon as it is known to be too long, and the rest of
/// it is discarded as it arrives: it is never buffered whole. Blank and
/// whitespace-only lines are dropped here.
///
/// The lines a read completes are copied out of it once, into one array
/// they share as slices (one allocation per read, not per line: a
/// pipelining client sends a few hundred lines per read). Only when they
/// fill at least half of that array: otherwise (blank or skipped lines
/// between them) each is copied alone, so what the lines hold is never more
/// than twice what they count — the server bounds memory by their counts.
public struct LineFramer: Sendable {
    /// What the framer found: a whole line, or a line over the limit (skipped).
    public enum Frame: Equatable, Sendable {
        /// A line's bytes, without its line ending; a slice of an array it
        /// may share with the other lines of its read (its indices are that
        /// array's: read it through `withUnsafeBufferPointer` or from `startIndex`).
        case line(ArraySlice<UInt8>)
        case tooLarge
    }

    /// The longest line (without its newline) passed on whole.
    public let maxLineBytes: Int
    private var buffer: [UInt8] = []
    private var skipping = false

    /// A framer with no bytes buffered.
    public init(maxLineBytes: Int) {
        self.maxLineBytes = maxLineBytes
    }

    /// Bytes held for an unfinished line.
    public var bufferedBytes: Int { buffer.count }

    /// Feeds bytes as they arrive; `emit` is called once per complete line, in order.
    public mutating func feed(_ bytes: UnsafeRawBufferPointer, _ emit: (Frame) -> Void) {
        var start = 0
        let n = bytes.count
        guard n > 0 else { return }
        let base = bytes.baseAddress!
        // The line that was unfinished (or being skipped) ends at the first newline.
        if skipping || !buffer.isEmpty {
            guard let p = memchrNewline(base, n) else {
                keep(bytes, from: 0, emit)
                return
            }
            if skipping {
                skipping = false
            } else {
                buffer.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[0 ..< p]))
                let line = buffer
                buffer = []
                finish(line[...], emit)
            }
            start = p + 1
        }
        // The lines this read completes (up to its last newline), in groups
        // of up to 128: their ends noted on the stack (1 KiB: a larger
        // temporary allocation went to the heap, a malloc and a free per
        // read, most of the framing of a request that arrives alone), and
        // how many of their bytes will be passed on.
        withUnsafeTemporaryAllocation(of: Int.self, capacity: 128) { ends in
            var s = start
            while true {
                let first = s
                var last = -1, kept = 0, lines = 0
                while lines < ends.count, s < n, let p = memchrNewline(base + s, n - s) {
                    if passesOn(base + s, p) { kept += p + 1 }
                    last = s + p
                    ends[lines] = last
                    lines += 1
                    s = last + 1
                }
                guard last >= 0 else {
                    keep(bytes, from: first, emit)
                    return
                }
                // One array for the group's lines when they are most of its
                // bytes (they share it as slices), else each line its own.
                var from = first
                if kept * 2 >= last + 1 - first {
                    let chunk = Array(UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self) + first, count: last + 1 - first))
                    for k in 0 ..< lines {
                        finish(chunk[(from - first) ..< (ends[k] - first)], emit)
                        from = ends[k] + 1
                    }
                } else {
                    for k in 0 ..< lines {
                        finish(Array(UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self) + from, count: ends[k] - from))[...], emit)
                        from = ends[k] + 1
                    }
                }
                // A full group: more lines may follow.
                if lines < ends.count {
                    keep(bytes, from: last + 1, emit)
                    return
                }
            }
        }
    }

    /// ``feed(_:_:)`` for an array.
    public mutating func feed(_ bytes: [UInt8], _ emit: (Frame) -> Void) {
        bytes.withUnsafeBytes { feed($0, emit) }
    }

    /// Keeps `bytes[from...]` (no newline in them) for the unfinished line,
    /// or starts skipping it once it is too long.
    private mutating func keep(_ bytes: UnsafeRawBufferPointer, from start: Int, _ emit: (Frame) -> Void) {
        guard start < bytes.count, !skipping else { return }
        buffer.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[start ..< bytes.count]))
        // One extra byte may be the '\r' of a line that is exactly at the limit.
        if buffer.count > maxLineBytes + 1 {
            buffer = []
            skipping = true
            emit(.tooLarge)
        }
    }

    /// Whether the `count` bytes at `p` (a line without its newline) are
    /// passed on by `finish`: not too long, not blank.
    private func passesOn(_ p: UnsafeRawPointer, _ count: Int) -> Bool {
        let bytes = p.assumingMemoryBound(to: UInt8.self)
        let n = count > 0 && bytes[count - 1] == 0x0D ? count - 1 : count
        guard n <= maxLineBytes else { return false }
        for i in 0 ..< n where !(bytes[i] == 0x20 || bytes[i] == 0x09 || bytes[i] == 0x0D) { return true }
        return false
    }

    private func finish(_ line: ArraySlice<UInt8>, _ emit: (Frame) -> Void) {
        var line = line
        // A slice of the read's shared array: dropping keeps sharing it (a
        // removal would copy the slice out).
        if line.last == 0x0D { line = line.dropLast() }
        if line.count > maxLineBytes {
            emit(.tooLarge)
            return
        }
        for c in line where !(c == 0x20 || c == 0x09 || c == 0x0D) {
            emit(.line(line))
            return
        }
    }
}

/// The index of the first newline in `p[0..<count]`: the C library's
/// `memchr` (glibc's reads 32 bytes a step with AVX2: ~60 instructions for
/// an update's line, against ~260 for the eight-bytes-a-step loop it
/// replaces, and ~1,000 for a byte loop).
@inline(__always)
private func memchrNewline(_ p: UnsafeRawPointer, _ count: Int) -> Int? {
    guard count > 0, let hit = memchr(p, 0x0A, count) else { return nil }
    return UnsafeRawPointer(hit) - p
}
