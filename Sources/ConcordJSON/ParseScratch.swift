#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What the tree parser reuses from one line to the next on one thread:
/// its two stacks (grown once, not allocated and freed per line) and a
/// table of the short ASCII strings it built recently.
///
/// Member names repeat from line to line ("op", "model", "id", a model's
/// own names) and so do short values (an op, a small number): a string of
/// at most 15 bytes is a value with no storage of its own, and a table hit
/// — one multiply, two word compares — hands it back for ~30 instructions
/// where building and validating it costs ~150. A miss builds it and takes
/// the slot (one slot per hash, no chains: bounded memory, ~10 KB per thread).
///
/// One per thread (`current`), made on first use and freed when the thread
/// ends: parsers run on the sequencer, on the worker pool and on the
/// big-line thread, and a thread parses one line at a time. A parse takes
/// the stacks out of the scratch and puts them back when done, so a parse
/// nested in another (none today) would only find them empty.
final class ParseScratch {
    var memberStack = MoveStack<JSONObject.Member>()
    var itemStack = MoveStack<JSON>()
    let table: ShortStrings
    let longTable: LongStrings

    init() {
        table = ShortStrings()
        longTable = LongStrings()
    }

    deinit {
        memberStack.release()
        itemStack.release()
        table.free()
        longTable.free()
    }

    private static let key: pthread_key_t = {
        var k = pthread_key_t()
        let rc = pthread_key_create(&k) { p in
            if let p { Unmanaged<ParseScratch>.fromOpaque(p).release() }
        }
        precondition(rc == 0, "pthread_key_create failed (\(rc))")
        return k
    }()

    /// This thread's scratch.
    static var current: ParseScratch {
        if let p = pthread_getspecific(key) { return Unmanaged<ParseScratch>.fromOpaque(p).takeUnretainedValue() }
        let s = ParseScratch()
        pthread_setspecific(key, Unmanaged.passRetained(s).toOpaque())
        return s
    }
}

/// The scratch's table of short strings: the bytes of each slot
/// (little-endian words, zero past the count) apart from its strings, so
/// that a probe reads three plain words and copies a string only on a hit.
/// Owned by its `ParseScratch` (`free()` in its deinit); parser states
/// hold it as a plain value.
struct ShortStrings {
    static let slots = 256

    struct Bytes {
        var w0: UInt64
        var w1: UInt64
        var count: Int
    }

    let bytes: UnsafeMutablePointer<Bytes>
    let strings: UnsafeMutablePointer<String>
    /// `smallLayout`, read once: a static's value is reached through
    /// `swift_once` at every use, and this one is used for every short string.
    let madeFromWords: Bool
    /// Slots of the table: none where strings are made from their words.
    private let tableSlots: Int

    init() {
        madeFromWords = Self.smallLayout
        tableSlots = madeFromWords ? 0 : Self.slots
        bytes = .allocate(capacity: tableSlots)
        bytes.initialize(repeating: Bytes(w0: 0, w1: 0, count: -1), count: tableSlots)
        strings = .allocate(capacity: tableSlots)
        strings.initialize(repeating: "", count: tableSlots)
    }

    func free() {
        bytes.deallocate()
        strings.deinitialize(count: tableSlots)
        strings.deallocate()
    }

    /// A small ASCII string (at most 15 bytes) is two words: its bytes,
    /// little-endian, and in the top byte of the second word its tag
    /// (immortal, ASCII, small: 0xE) and its count — the standard library's
    /// layout on 64-bit platforms, which `sameText` reads too. Checked once
    /// against strings the library builds; where it does not hold, the
    /// table below is used.
    @inline(__always)
    static func small(_ w0: UInt64, _ w1: UInt64, count: Int) -> String {
        unsafeBitCast((w0, w1 | (UInt64(0xE0 | count) &<< 56)), to: String.self)
    }

    static let smallLayout: Bool = {
        let texts = ["", "a", "op", "model", "abcdefgh", "abcdefghi", "abcdefghijklmno"]
        for t in texts {
            var w0: UInt64 = 0, w1: UInt64 = 0
            for (i, b) in t.utf8.enumerated() {
                if i < 8 { w0 |= UInt64(b) &<< UInt64(8 &* i) } else { w1 |= UInt64(b) &<< UInt64(8 &* (i &- 8)) }
            }
            let built = String(decoding: Array(t.utf8), as: UTF8.self)
            let bits = unsafeBitCast(built, to: (UInt64, UInt64).self)
            guard bits.0 == w0 && bits.1 == w1 | (UInt64(0xE0 | t.utf8.count) &<< 56) else { return false }
        }
        return true
    }()

    /// The string of the ASCII bytes `base[0..<count]` (`count` ≤ 15):
    /// made from its words (`small`), or from the table when it holds them. `readable`: how many bytes from
    /// `base` may be loaded (the words are loaded whole when 16 are).
    @inline(__always)
    func ascii(_ base: UnsafePointer<UInt8>, count: Int, readable: Int) -> String {
        var w0: UInt64 = 0, w1: UInt64 = 0
        if readable >= 16 {
            let raw = UnsafeRawPointer(base)
            w0 = UInt64(littleEndian: raw.loadUnaligned(as: UInt64.self))
            w1 = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
            if count < 8 {
                w0 &= count == 0 ? 0 : ~0 &>> UInt64(64 &- 8 &* count)
                w1 = 0
            } else {
                w1 &= count == 8 ? 0 : ~0 &>> UInt64(128 &- 8 &* count)
            }
        } else {
            for i in 0..<count {
                if i < 8 { w0 |= UInt64(base[i]) &<< UInt64(8 &* i) } else { w1 |= UInt64(base[i]) &<< UInt64(8 &* (i &- 8)) }
            }
        }
        // The string is its two words and a tag: no table needed where the
        // runtime lays small strings out as checked once (`smallLayout`).
        if madeFromWords { return Self.small(w0, w1, count: count) }
        let h = (w0 &* 0x9E37_79B9_7F4A_7C15) ^ (w1 &* 0xC2B2_AE3D_27D4_EB4F) ^ UInt64(count)
        let i = Int(truncatingIfNeeded: (h &* 0xFF51_AFD7_ED55_8CCD) &>> 56)
        let b = bytes + i
        if b.pointee.count == count && b.pointee.w0 == w0 && b.pointee.w1 == w1 {
            return strings[i]
        }
        let s = asciiString(UnsafeBufferPointer(start: base, count: count))
        b.pointee = Bytes(w0: w0, w1: w1, count: count)
        strings[i] = s
        return s
    }
}


/// The scratch's table of the longer strings (ASCII of 16 to ``maxCount``
/// bytes; other UTF-8 of 8 to ``maxCount``) it built recently, so that a value sent again — a title, a URL, a body
/// that an update repeats unchanged — is handed back as the same string:
/// no allocation, no copy, and compared with its stored copy by identity
/// (`sameText` looks at the two words first). A miss costs the hash
/// (eight bytes a step) and takes the slot; a hit, the hash and a `memcmp`.
/// Bounded: ``slots`` strings of at most ``maxCount`` bytes and their
/// bytes again (~90 KB per parsing thread at most); a string the table
/// holds lives until its slot is taken.
final class LongStrings {
    static let slots = 256
    static let maxCount = 128

    let hashes: UnsafeMutablePointer<UInt64>
    let counts: UnsafeMutablePointer<Int>
    /// `slots` × `maxCount` bytes: slot i's string's bytes at `i * maxCount`.
    let bytes: UnsafeMutablePointer<UInt8>
    let strings: UnsafeMutablePointer<String>

    init() {
        hashes = .allocate(capacity: Self.slots)
        hashes.initialize(repeating: 0, count: Self.slots)
        counts = .allocate(capacity: Self.slots)
        counts.initialize(repeating: -1, count: Self.slots)
        bytes = .allocate(capacity: Self.slots * Self.maxCount)
        strings = .allocate(capacity: Self.slots)
        strings.initialize(repeating: "", count: Self.slots)
    }

    /// Whether `count` (≥ 8) bytes at `a` and `b` are equal, eight at a time
    /// (the last eight overlapping): `memcmp` through the PLT cost twice as much.
    @inline(__always)
    static func same(_ a: UnsafeRawPointer, _ b: UnsafeRawPointer, _ count: Int) -> Bool {
        var i = 0
        while i &+ 8 <= count {
            if a.loadUnaligned(fromByteOffset: i, as: UInt64.self) != b.loadUnaligned(fromByteOffset: i, as: UInt64.self) { return false }
            i &+= 8
        }
        return a.loadUnaligned(fromByteOffset: count &- 8, as: UInt64.self) == b.loadUnaligned(fromByteOffset: count &- 8, as: UInt64.self)
    }

    func free() {
        hashes.deallocate()
        counts.deallocate()
        bytes.deallocate()
        strings.deinitialize(count: Self.slots)
        strings.deallocate()
    }

    /// The string of the ASCII bytes `base[0..<count]` (16 ≤ `count` ≤ ``maxCount``),
    /// from the table when it holds them.
    @inline(never)
    func ascii(_ base: UnsafePointer<UInt8>, count: Int) -> String {
        text(base, count: count, ascii: true)!
    }

    /// The string of the UTF-8 bytes `base[0..<count]` (8 ≤ `count` ≤
    /// ``maxCount``), from the table when it holds them (they were valid
    /// when they entered it: no validation again), else validated — nil
    /// when they are not valid UTF-8.
    @inline(never)
    func utf8(_ base: UnsafePointer<UInt8>, count: Int) -> String? {
        text(base, count: count, ascii: false)
    }

    @inline(__always)
    private func text(_ base: UnsafePointer<UInt8>, count: Int, ascii: Bool) -> String? {
        let raw = UnsafeRawPointer(base)
        var h = UInt64(truncatingIfNeeded: count) &* 0x9E37_79B9_7F4A_7C15
        var i = 0
        while i &+ 8 <= count {
            h = (h ^ UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: i, as: UInt64.self))) &* 0xC2B2_AE3D_27D4_EB4F
            h ^= h &>> 29
            i &+= 8
        }
        // The last eight bytes (they overlap the words above unless the count is a multiple of eight).
        h = (h ^ UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: count &- 8, as: UInt64.self))) &* 0xFF51_AFD7_ED55_8CCD
        h ^= h &>> 32
        let slot = Int(truncatingIfNeeded: h &>> 56)
        let kept = bytes + slot &* Self.maxCount
        if hashes[slot] == h && counts[slot] == count && Self.same(UnsafeRawPointer(kept), raw, count) {
            return strings[slot]
        }
        let s: String
        if ascii {
            s = asciiString(UnsafeBufferPointer(start: base, count: count))
        } else {
            guard let valid = String(validating: UnsafeBufferPointer(start: base, count: count), as: UTF8.self) else { return nil }
            s = valid
        }
        hashes[slot] = h
        counts[slot] = count
        kept.update(from: base, count: count)
        strings[slot] = s
        return s
    }
}
