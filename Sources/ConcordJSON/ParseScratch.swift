#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What the tree parser reuses from one line to the next on one thread:
/// its two stacks (grown once, not allocated and freed per line) and
/// three tables of what it built recently: short ASCII strings (below),
/// longer strings (``LongStrings``) and small nested objects and arrays
/// (``SmallContainers``), each of a fixed number of slots.
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
    let containers: SmallContainers

    init() {
        table = ShortStrings()
        longTable = LongStrings()
        containers = SmallContainers.make()
    }

    deinit {
        memberStack.release()
        itemStack.release()
        table.free()
        longTable.free()
        containers.free()
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


/// Eight bytes at a time from `raw[0..<count]` (8 ≤ `count`), the last
/// eight overlapping: the hash of the scratch's tables of longer strings
/// and of small containers.
@inline(__always)
func hashBytes(_ raw: UnsafeRawPointer, count: Int) -> UInt64 {
    var h = UInt64(truncatingIfNeeded: count) &* 0x9E37_79B9_7F4A_7C15
    var i = 0
    while i &+ 8 <= count {
        h = (h ^ UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: i, as: UInt64.self))) &* 0xC2B2_AE3D_27D4_EB4F
        h ^= h &>> 29
        i &+= 8
    }
    h = (h ^ UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: count &- 8, as: UInt64.self))) &* 0xFF51_AFD7_ED55_8CCD
    h ^= h &>> 32
    return h
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
        let h = hashBytes(raw, count: count)
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

/// The scratch's table of the small objects and arrays it built recently,
/// by the bytes they were parsed from: a nested value that an update
/// repeats unchanged — a post's author, a list of tags — is handed back as
/// the very tree stored with the previous version: its bytes are found by
/// following brackets and strings (no value built), hashed and compared;
/// nothing is parsed or allocated for it, nothing is freed with the
/// previous version (which shares the tree), and the two versions compare
/// equal by their buffers' address. A miss parses as always and takes the slot.
///
/// A tree is a function of the bytes it was parsed from (the same names in
/// the same order, the same spellings, the same repeated names resolved
/// alike), so the value handed back is the one the parse would have built,
/// and the bytes it was kept under parsed without an error. What the parse
/// depends on besides the bytes is checked or replayed: the depth (a hit
/// needs the bytes' nesting to fit under the parser's limit from where
/// they are) and the count of irregularities (added as the parse added it).
/// Only values nested in another value's member are kept (`depth` ≥ 3: not
/// a request, not its model), of 8 to ``maxCount`` bytes.
///
/// Bounded like ``LongStrings``: ``slots`` values of at most ``maxCount``
/// bytes each and their bytes (one allocation of ~46 KB per parsing
/// thread: 32 KB of bytes, 14 KB of slots; and the trees, a few times
/// their bytes); a value the table holds lives until its
/// slot is taken. The trees are immutable values shared by reference count,
/// so one handed to another thread (the sequencer) stays valid after its
/// slot is reused.
struct SmallContainers {
    static let slots = 256
    static let maxCount = 128
    static let minCount = 8

    /// One allocation, one word in the parser's state (a value: the parser
    /// copies it without reference counting). Layout: the miss count and
    /// the sampling tick, then per slot its hash, byte count, irregularity
    /// count and value, then the slots' bytes (``maxCount`` each).
    private let base: UnsafeMutableRawPointer
    private static let hashesAt = 16
    private static let countsAt = hashesAt + slots * 8
    private static let irregularitiesAt = countsAt + slots * 8
    private static let valuesAt = irregularitiesAt + slots * 8
    private static let bytesAt = valuesAt + slots * MemoryLayout<JSON>.stride
    private static let size = bytesAt + slots * maxCount

    private var missRun: UnsafeMutablePointer<Int> { base.assumingMemoryBound(to: Int.self) }
    private var tick: UnsafeMutablePointer<UInt32> { (base + 8).assumingMemoryBound(to: UInt32.self) }
    private var hashes: UnsafeMutablePointer<UInt64> { (base + Self.hashesAt).assumingMemoryBound(to: UInt64.self) }
    private var counts: UnsafeMutablePointer<Int> { (base + Self.countsAt).assumingMemoryBound(to: Int.self) }
    /// What the parse of each slot's bytes added to the parser's count of
    /// irregularities (whitespace, escapes, repeated names), added again on a hit.
    private var irregularities: UnsafeMutablePointer<Int> { (base + Self.irregularitiesAt).assumingMemoryBound(to: Int.self) }
    private var values: UnsafeMutablePointer<JSON> { (base + Self.valuesAt).assumingMemoryBound(to: JSON.self) }
    private var bytes: UnsafeMutablePointer<UInt8> { (base + Self.bytesAt).assumingMemoryBound(to: UInt8.self) }

    /// Made by the thread's ``ParseScratch``, which frees it.
    static func make() -> SmallContainers {
        assert(valuesAt % MemoryLayout<JSON>.alignment == 0, "the values' offset must suit JSON's alignment")
        let p = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 16)
        p.initializeMemory(as: Int.self, repeating: 0, count: 2)
        (p + hashesAt).initializeMemory(as: UInt64.self, repeating: 0, count: slots)
        (p + countsAt).initializeMemory(as: Int.self, repeating: -1, count: slots)
        (p + irregularitiesAt).initializeMemory(as: Int.self, repeating: 0, count: slots)
        (p + valuesAt).initializeMemory(as: JSON.self, repeating: .null, count: slots)
        return SmallContainers(base: p)
    }

    func free() {
        values.deinitialize(count: Self.slots)
        base.deallocate()
    }

    /// After this many misses in a row, only one container in
    /// ``sampleEvery`` is looked up, until one is found again: a line of
    /// distinct values (a bulk load, a collection's new items) pays
    /// ~1/32 of a miss's cost per container instead of all of it, while
    /// a stream of writes that repeat their nested values keeps finding them.
    static let missesBeforeSampling = 64
    static let sampleEvery: UInt32 = 32

    /// Whether to look the next container up.
    @inline(__always)
    func shouldLook() -> Bool {
        if missRun.pointee < Self.missesBeforeSampling { return true }
        tick.pointee &+= 1
        return tick.pointee & (Self.sampleEvery &- 1) == 0
    }

    /// A container that could not be looked up (too long, too short, too deep here).
    @inline(__always)
    func missed() { missRun.pointee &+= 1 }

    /// What a lookup learned, for keeping the value parsed after a miss.
    struct Probe {
        var count = 0
        var hash: UInt64 = 0
    }

    /// The value parsed from `base[0..<count]` (``minCount`` ≤ `count` ≤
    /// ``maxCount``) and how many irregularities its parse counted, when
    /// the table holds it; else nil, and `probe` is what ``keep`` takes.
    @inline(__always)
    func find(_ base: UnsafePointer<UInt8>, count: Int, _ probe: inout Probe) -> (JSON, Int)? {
        let raw = UnsafeRawPointer(base)
        let h = hashBytes(raw, count: count)
        let slot = Int(truncatingIfNeeded: h &>> 56)
        if hashes[slot] == h && counts[slot] == count && LongStrings.same(UnsafeRawPointer(bytes + slot &* Self.maxCount), raw, count) {
            missRun.pointee = 0
            return (values[slot], irregularities[slot])
        }
        missRun.pointee &+= 1
        probe = Probe(count: count, hash: h)
        return nil
    }

    /// Keeps `value`, parsed from the bytes at `base` that `probe` looked up.
    @inline(__always)
    func keep(_ value: JSON, _ base: UnsafePointer<UInt8>, _ probe: Probe, irregular: Int) {
        let slot = Int(truncatingIfNeeded: probe.hash &>> 56)
        hashes[slot] = probe.hash
        counts[slot] = probe.count
        irregularities[slot] = irregular
        (bytes + slot &* Self.maxCount).update(from: base, count: probe.count)
        values[slot] = value
    }
}
