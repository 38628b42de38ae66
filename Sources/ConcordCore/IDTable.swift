import ConcordJSON

/// A hash table from identities (entity ids, document keys) to values: the
/// store's records by identity, and the change sets' members.
///
/// Why not `[String: Value]`: a `Dictionary` hashes a `String` with SipHash
/// (~150–250 instructions for an identity of a few bytes), and an update
/// looks identities up a dozen times. Here an identity's bytes are hashed
/// with a seeded multiply-mix hash (`IDHash`, ~20–40 instructions), each
/// entry keeps 32 bits of its hash (a probe compares those before the
/// strings; growing never hashes again), and the slots are 4-byte indices
/// into dense arrays of keys and values. The arrays are memory the storage
/// manages itself (no `Array`: each access to an array held by a class
/// retained and released its buffer, and a lookup made three).
///
/// Iteration order is the dense order: insertion order, except that a
/// removal moves the last entry into the hole. It is the same on every run
/// for the same operations (no seed in it), but not meaningful: callers that
/// emit output sort first.
///
/// Linear probing, at most 1/2 full, backward-shift deletion (no
/// tombstones); the slots shrink when the table falls under 1/8 full.
/// Copy-on-write over one class instance (none while empty).
struct IDTable<Value> {
    /// nil while empty: an empty table (most of a change's sets) is one
    /// word, allocates nothing and copies as a nil.
    private var storage: Storage? = nil

    final class Storage {
        /// Entries `0..<count` of the dense arrays are initialized.
        private(set) var count = 0
        private var denseCapacity: Int
        private(set) var keys: UnsafeMutablePointer<String>
        private(set) var values: UnsafeMutablePointer<Value>
        private(set) var hashes: UnsafeMutablePointer<UInt32>
        /// Index into the dense arrays, or -1 (empty); `slotCount` of them, a power of two.
        private(set) var slots: UnsafeMutablePointer<Int32>
        private(set) var slotCount: Int

        /// `IDHash.seed`, kept here: reading a static `let` goes through
        /// `swift_once` on every call, and every lookup hashes.
        let seed = IDHash.seed

        /// The hash of `key` in this table.
        @inline(__always)
        func hash(_ key: String) -> UInt32 { IDHash.of(key, seed: seed) }

        init(denseCapacity: Int, slotCount: Int) {
            self.denseCapacity = denseCapacity
            keys = .allocate(capacity: denseCapacity)
            values = .allocate(capacity: denseCapacity)
            hashes = .allocate(capacity: denseCapacity)
            self.slotCount = slotCount
            slots = .allocate(capacity: slotCount)
            slots.initialize(repeating: -1, count: slotCount)
        }

        deinit {
            keys.deinitialize(count: count)
            keys.deallocate()
            values.deinitialize(count: count)
            values.deallocate()
            hashes.deallocate()
            slots.deallocate()
        }

        func copy(denseCapacity: Int? = nil) -> Storage {
            let c = Storage(denseCapacity: Swift.max(denseCapacity ?? self.denseCapacity, count), slotCount: slotCount)
            c.keys.initialize(from: keys, count: count)
            c.values.initialize(from: values, count: count)
            c.hashes.initialize(from: hashes, count: count)
            c.slots.update(from: slots, count: slotCount)
            c.count = count
            return c
        }

        var isFull: Bool { count == denseCapacity }

        /// The value under `key`. (A method of the storage, called through
        /// the table's optional: the storage is borrowed, where binding it
        /// to a name retained and released it around every lookup.)
        @inline(__always)
        func value(_ key: String) -> Value? {
            entry(key).map { values[$0] }
        }

        /// The entry of `key` in the dense order.
        @inline(__always)
        func entry(_ key: String) -> Int? {
            count > 0 ? find(key, hash(key)).entry : nil
        }

        /// The slot holding `key` (or the empty slot where it would go) and its entry.
        @inline(__always)
        func find(_ key: String, _ h: UInt32) -> (slot: Int, entry: Int?) {
            let mask = slotCount &- 1
            var i = Int(h) & mask
            while true {
                let e = Int(slots[i])
                if e < 0 { return (i, nil) }
                if hashes[e] == h && sameText(keys[e], key) { return (i, e) }
                i = (i &+ 1) & mask
            }
        }

        /// Places every entry again in `size` slots, by the hashes it kept.
        func resize(_ size: Int) {
            slots.deallocate()
            slots = .allocate(capacity: size)
            slots.initialize(repeating: -1, count: size)
            slotCount = size
            let mask = size - 1
            for e in 0..<count {
                var i = Int(hashes[e]) & mask
                while slots[i] >= 0 { i = (i + 1) & mask }
                slots[i] = Int32(e)
            }
        }

        /// Room for one more entry in the slots; returns where `key` is or
        /// would go. (The dense arrays' room is the table's to make: they
        /// are replaced when they grow, see `IDTable.grown`.)
        @inline(__always)
        func prepareInsert(_ key: String, _ h: UInt32) -> (slot: Int, entry: Int?) {
            if (count + 1) * 2 > slotCount { resize(Swift.max(8, slotCount * 2)) }
            return find(key, h)
        }

        /// Appends an entry (the dense arrays have room).
        @inline(__always)
        func append(_ key: String, _ value: __owned Value, _ h: UInt32, at slot: Int) {
            slots[slot] = Int32(count)
            (keys + count).initialize(to: key)
            (values + count).initialize(to: value)
            hashes[count] = h
            count += 1
        }

        func remove(slot: Int, entry: Int) -> Value {
            let mask = slotCount - 1
            // Backward-shift deletion: later entries of the run move up to stay reachable.
            var hole = slot
            var j = (hole + 1) & mask
            while slots[j] >= 0 {
                let home = Int(hashes[Int(slots[j])]) & mask
                if movesIntoHole(home: home, hole: hole, slot: j) {
                    slots[hole] = slots[j]
                    hole = j
                }
                j = (j + 1) & mask
            }
            slots[hole] = -1
            // The dense arrays stay dense: the last entry moves into the removed one's place.
            let last = count - 1
            (keys + entry).deinitialize(count: 1)
            let old = (values + entry).move()
            if entry != last {
                var k = Int(hashes[last]) & mask
                while Int(slots[k]) != last { k = (k + 1) & mask }
                slots[k] = Int32(entry)
                (keys + entry).moveInitialize(from: keys + last, count: 1)
                (values + entry).moveInitialize(from: values + last, count: 1)
                hashes[entry] = hashes[last]
            }
            count = last
            if slotCount > 16 && count * 8 < slotCount { resize(slotCount / 2) }
            return old
        }

        /// Destroys every entry, keeping the memory.
        func removeAll() {
            keys.deinitialize(count: count)
            values.deinitialize(count: count)
            count = 0
            slots.update(repeating: -1, count: slotCount)
        }

        /// Room for `n` entries in the dense arrays (moved to new memory).
        func growDense(to n: Int) {
            guard n > denseCapacity else { return }
            let k = UnsafeMutablePointer<String>.allocate(capacity: n)
            k.moveInitialize(from: keys, count: count)
            keys.deallocate()
            keys = k
            let v = UnsafeMutablePointer<Value>.allocate(capacity: n)
            v.moveInitialize(from: values, count: count)
            values.deallocate()
            values = v
            let h = UnsafeMutablePointer<UInt32>.allocate(capacity: n)
            h.moveInitialize(from: hashes, count: count)
            hashes.deallocate()
            hashes = h
            denseCapacity = n
        }
    }

    init() {}

    var count: Int { storage?.count ?? 0 }
    var isEmpty: Bool { count == 0 }
    /// The keys in iteration order.
    var keys: [String] {
        guard let s = storage else { return [] }
        return Array(UnsafeBufferPointer(start: s.keys, count: s.count))
    }
    var values: [Value] {
        guard let s = storage else { return [] }
        return Array(UnsafeBufferPointer(start: s.values, count: s.count))
    }

    /// The key at `i` in iteration order (`0..<count`).
    @inline(__always)
    func key(at i: Int) -> String { storage!.keys[i] }

    /// The storage, unshared (and with room for one more entry when
    /// `adding`), for a mutation.
    @inline(__always)
    private mutating func unique(adding: Bool = true) -> Storage {
        // Uniqueness is asked before `storage` is bound to a name: a binding
        // is a second reference, and every mutation would copy.
        if storage == nil {
            let s = Storage(denseCapacity: 4, slotCount: 8)
            storage = s
            return s
        }
        if !isKnownUniquelyReferenced(&storage!) {
            let s = storage!
            let c = s.copy(denseCapacity: adding && s.isFull ? s.count * 2 : nil)
            storage = c
            return c
        }
        let s = storage!
        if adding && s.isFull { s.growDense(to: s.count * 2) }
        return s
    }

    /// Where `key` lies in the dense order.
    @inline(__always)
    func index(of key: String) -> Int? {
        storage?.entry(key)
    }

    func contains(_ key: String) -> Bool { index(of: key) != nil }

    /// Calls `body` with the value under `key`, read in place (no copy of
    /// it, nor of the table); false when absent.
    @inline(__always)
    func withValue(_ key: String, _ body: (Value) -> Void) -> Bool {
        guard let s = storage, let e = s.entry(key) else { return false }
        body(s.values[e])
        return true
    }

    /// Calls `body` with each entry in iteration order, read in place.
    @inline(__always)
    func forEachEntry(_ body: (String, Value) -> Void) {
        guard let s = storage else { return }
        for i in 0..<s.count { body(s.keys[i], s.values[i]) }
    }

    /// Calls `body` with the first machine word of each value, in iteration
    /// order, read from the table's memory: no copy, no retain. For a value
    /// whose first stored property is a class reference (`Store.Holding`),
    /// that word is the object's address — for a prefetch, which must not
    /// touch the object (a retain writes to it, and waits for its line).
    @inline(__always)
    func forEachFirstWord(_ body: (UInt) -> Void) {
        guard let s = storage, MemoryLayout<Value>.size >= MemoryLayout<UInt>.size else { return }
        for i in 0..<s.count { body(UnsafeRawPointer(s.values + i).load(as: UInt.self)) }
    }

    subscript(key: String) -> Value? {
        get { storage?.value(key) }
        set {
            if let newValue { updateValue(newValue, forKey: key) } else { removeValue(forKey: key) }
        }
    }

    /// Sets the value; returns the old one (nil: `key` is new).
    @discardableResult
    mutating func updateValue(_ value: __owned Value, forKey key: String) -> Value? {
        let s = unique()
        let h = s.hash(key)
        let (slot, entry) = s.prepareInsert(key, h)
        if let entry {
            let old = (s.values + entry).move()
            (s.values + entry).initialize(to: value)
            return old
        }
        s.append(key, value, h, at: slot)
        return nil
    }

    /// Adds `key` unless present; returns whether it was absent.
    @discardableResult
    mutating func insert(_ key: String, _ value: __owned Value) -> Bool {
        let s = unique()
        let h = s.hash(key)
        let (slot, entry) = s.prepareInsert(key, h)
        if entry != nil { return false }
        s.append(key, value, h, at: slot)
        return true
    }

    /// Changes the value under `key` in place (`initial` first when absent:
    /// no copy of a value that is itself copy-on-write), and removes the key
    /// when `body` returns false. Returns whether the key is there afterwards.
    @discardableResult
    mutating func modify(_ key: String, default initial: @autoclosure () -> Value, _ body: (inout Value) -> Bool) -> Bool {
        let s = unique()
        let h = s.hash(key)
        var (slot, found) = s.prepareInsert(key, h)
        if found == nil {
            s.append(key, initial(), h, at: slot)
            found = s.count - 1
        }
        let entry = found!
        if body(&s.values[entry]) { return true }
        _ = s.remove(slot: slot, entry: entry)
        return false
    }

    @discardableResult
    mutating func removeValue(forKey key: String) -> Value? {
        // Found before `unique()` (an absent key copies nothing); a copy has
        // the same slots and entries, so the place found holds in it too.
        // (In a function of its own: a binding of the storage alive at
        // `unique()` would make it copy.)
        guard let (slot, entry) = locate(key) else { return nil }
        return unique(adding: false).remove(slot: slot, entry: entry)
    }

    private func locate(_ key: String) -> (slot: Int, entry: Int)? {
        guard let s = storage, s.count > 0 else { return nil }
        let (slot, found) = s.find(key, s.hash(key))
        return found.map { (slot, $0) }
    }

    mutating func removeAll(keepingCapacity: Bool = false) {
        guard storage != nil else { return }
        guard keepingCapacity else {
            storage = nil
            return
        }
        unique(adding: false).removeAll()
    }

    mutating func reserveCapacity(_ n: Int) {
        let s = unique(adding: false)
        var size = Swift.max(8, s.slotCount)
        while n * 2 > size { size *= 2 }
        if size > s.slotCount { s.resize(size) }
        s.growDense(to: n)
    }

    /// Slots allocated (for tests of growth and shrinking).
    var capacity: Int { storage?.slotCount ?? 0 }

    /// Which storage the table uses (for tests: an unshared table is changed in place).
    var storageIdentity: ObjectIdentifier? { storage.map(ObjectIdentifier.init) }
}

extension IDTable: Sequence {
    struct Iterator: IteratorProtocol {
        fileprivate let storage: Storage?
        fileprivate var i = 0
        mutating func next() -> (key: String, value: Value)? {
            guard let s = storage, i < s.count else { return nil }
            defer { i += 1 }
            return (s.keys[i], s.values[i])
        }
    }

    func makeIterator() -> Iterator { Iterator(storage: storage) }
    var underestimatedCount: Int { count }
}

extension IDTable: ExpressibleByDictionaryLiteral {
    init(dictionaryLiteral elements: (String, Value)...) {
        for (k, v) in elements { updateValue(v, forKey: k) }
    }
}

/// The hash of an identity's UTF-8 bytes for `IDTable`: 8 bytes at a time,
/// each mixed in with a 64×64→128-bit multiply, seeded per process (a
/// client cannot choose identities that collide without knowing the seed).
/// Only placement depends on it, never output.
enum IDHash {
    static let seed: UInt64 = {
        var g = SystemRandomNumberGenerator()
        return g.next() | 1
    }()

    @inline(__always)
    static func mix(_ a: UInt64, _ b: UInt64) -> UInt64 {
        let r = a.multipliedFullWidth(by: b)
        return r.high ^ r.low
    }

    /// (Through `utf8`'s contiguous storage, which a `String` always has
    /// here: native or small, never bridged on this platform. The key is
    /// borrowed, not copied: `withUTF8` is mutating, and the copy it needs
    /// retained and released the string.)
    ///
    /// A small string (at most 15 bytes, held in its two words: the bytes,
    /// zero past the count, and a discriminator byte with the count) is
    /// hashed from its words as they are — the same value as from its
    /// bytes, so a text hashes alike however it is held — without the
    /// spill to the stack that its contiguous storage costs.
    @inline(__always)
    static func of(_ key: String, seed: UInt64 = seed) -> UInt32 {
        let w = unsafeBitCast(key, to: (UInt64, UInt64).self)
        // Bit 61 of the second word: small.
        if w.1 & (1 << 61) != 0 {
            return small(w.0, w.1 & 0x00FF_FFFF_FFFF_FFFF, count: Int((w.1 >> 56) & 0xF), seed: seed)
        }
        if let h = key.utf8.withContiguousStorageIfAvailable({ of(UnsafeRawBufferPointer($0), seed: seed) }) { return h }
        var s = key
        return s.withUTF8 { of(UnsafeRawBufferPointer($0), seed: seed) }
    }

    /// `of(bytes)` for at most 15 bytes given as two little-endian words, zero past `count`.
    @inline(__always)
    static func small(_ w0: UInt64, _ w1: UInt64, count n: Int, seed: UInt64) -> UInt32 {
        var h = seed ^ (UInt64(n) &* 0x9E37_79B9_7F4A_7C15)
        if n >= 8 {
            h = mix(h ^ w0, 0xA076_1D64_78BD_642F)
            if n > 8 { h = mix(h ^ w1, 0xE703_7ED1_A0B4_28DB) }
        } else if n > 0 {
            h = mix(h ^ w0, 0xE703_7ED1_A0B4_28DB)
        }
        let f = mix(h, 0x8EBC_6AF0_9C88_C6E3)
        return UInt32(truncatingIfNeeded: f ^ (f >> 32))
    }

    static func of(_ bytes: UnsafeRawBufferPointer, seed: UInt64 = seed) -> UInt32 {
        let n = bytes.count
        var h = seed ^ (UInt64(n) &* 0x9E37_79B9_7F4A_7C15)
        var i = 0
        while i + 8 <= n {
            h = mix(h ^ bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self), 0xA076_1D64_78BD_642F)
            i += 8
        }
        if i < n {
            var t: UInt64 = 0
            var shift: UInt64 = 0
            while i < n {
                t |= UInt64(bytes[i]) << shift
                shift += 8
                i += 1
            }
            h = mix(h ^ t, 0xE703_7ED1_A0B4_28DB)
        }
        let f = mix(h, 0x8EBC_6AF0_9C88_C6E3)
        return UInt32(truncatingIfNeeded: f ^ (f >> 32))
    }
}

/// Backward-shift deletion in a linear-probing table (`IDTable`,
/// `Identities`, `ConnectionMap`): whether the entry at `slot`, whose home
/// is `home`, moves up into the `hole` — when its home is not in
/// (hole, slot], cyclically; an entry whose home is there stays reachable
/// where it is.
@inlinable @inline(__always)
func movesIntoHole(home: Int, hole: Int, slot j: Int) -> Bool {
    (j > hole && (home <= hole || home > j)) || (j < hole && (home <= hole && home > j))
}
