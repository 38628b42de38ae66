/// Eight bytes at a time over string contents (SWAR: "SIMD within a
/// register"), for the parser and the writer, whose strings are almost all
/// plain ASCII with nothing to escape: a byte-at-a-time loop spent ~15
/// instructions a byte there (bounds checks, four compares); a word of eight
/// plain bytes costs about as much as one byte did.
///
/// Each function returns a mask whose high bit is set in every byte lane
/// that needs attention. Lanes above the first flagged one may be flagged
/// falsely (a borrow out of a flagged lane), never the first, so callers
/// use only `firstLane(_:)`. Words are loaded as little-endian, so the
/// lowest lane is the first byte in memory.
enum ByteScan {
    @usableFromInline static let ones: UInt64 = 0x0101_0101_0101_0101
    @usableFromInline static let highs: UInt64 = 0x8080_8080_8080_8080

    /// Lanes equal to zero.
    @inline(__always) @usableFromInline
    static func zeroLanes(_ w: UInt64) -> UInt64 {
        (w &- ones) & ~w & highs
    }

    /// Lanes below 0x20 (control characters), `"` or `\`: what a JSON
    /// string's writer must escape.
    @inline(__always) @usableFromInline
    static func escapeLanes(_ w: UInt64) -> UInt64 {
        let control = (w &- ones &* 0x20) & ~w & highs
        return control | zeroLanes(w ^ (ones &* 0x22)) | zeroLanes(w ^ (ones &* 0x5C))
    }

    /// What a parser must look at: the writer's lanes (the closing quote,
    /// an escape, a control character to refuse) and non-ASCII bytes
    /// (UTF-8 to validate).
    @inline(__always) @usableFromInline
    static func parserLanes(_ w: UInt64) -> UInt64 {
        escapeLanes(w) | (w & highs)
    }

    /// The index of the first flagged lane of a non-zero mask.
    @inline(__always) @usableFromInline
    static func firstLane(_ mask: UInt64) -> Int {
        mask.trailingZeroBitCount &>> 3
    }

    /// The first index at or after `from` (and before `end`) whose byte the
    /// parser must look at, or `end`: whole words skipped, the rest byte by byte.
    @inline(__always) @usableFromInline
    static func skipPlain(_ base: UnsafePointer<UInt8>, from: Int, end: Int) -> Int {
        skip(base, from: from, end: end, lanes: parserLanes) { $0 < 0x20 || $0 == 0x22 || $0 == 0x5C || $0 >= 0x80 }
    }

    /// The first index at or after `from` (and before `end`) whose byte the
    /// writer must escape, or `end`.
    @inline(__always) @usableFromInline
    static func skipUnescaped(_ base: UnsafePointer<UInt8>, from: Int, end: Int) -> Int {
        skip(base, from: from, end: end, lanes: escapeLanes) { $0 < 0x20 || $0 == 0x22 || $0 == 0x5C }
    }

    /// Words while `lanes` flags none, then bytes while `stops` says no.
    @inline(__always)
    private static func skip(_ base: UnsafePointer<UInt8>, from: Int, end: Int,
                             lanes: (UInt64) -> UInt64, stops: (UInt8) -> Bool) -> Int {
        var i = from
        while i &+ 8 <= end {
            let m = lanes(UInt64(littleEndian: UnsafeRawPointer(base + i).loadUnaligned(as: UInt64.self)))
            if m != 0 { return i &+ firstLane(m) }
            i &+= 8
        }
        while i < end {
            if stops(base[i]) { return i }
            i &+= 1
        }
        return end
    }

    /// Where the object or array opening at `from` ends (the index after
    /// its closing bracket) and how many levels it nests (1 for one with no
    /// container inside), when that is before `limit`; nil otherwise. Only
    /// brackets and strings are followed: the bytes are not checked, so a
    /// caller uses the answer only to find bytes it knows to be a value.
    @inline(__always) @usableFromInline
    static func containerEnd(_ base: UnsafePointer<UInt8>, from: Int, limit: Int) -> (end: Int, height: Int)? {
        var i = from, depth = 0, height = 0
        while i < limit {
            let c = base[i]
            if c == 0x22 {
                i &+= 1
                while true {
                    i = skipUnescaped(base, from: i, end: limit)
                    guard i < limit else { return nil }
                    if base[i] == 0x22 { break }
                    // A backslash takes the next byte with it; a control
                    // byte is passed over (the parse refuses it).
                    i &+= base[i] == 0x5C ? 2 : 1
                }
            } else if c == 0x7B || c == 0x5B {
                depth &+= 1
                if depth > height { height = depth }
            } else if c == 0x7D || c == 0x5D {
                depth &-= 1
                if depth == 0 { return (i &+ 1, height) }
            }
            i &+= 1
        }
        return nil
    }
}
