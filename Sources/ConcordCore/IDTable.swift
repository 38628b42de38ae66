/// A hash table from identities (entity ids, document keys) to values: the
/// store's records by identity, and the change sets' members.
///
/// Why not `[String: Value]`: a `Dictionary` hashes a `String` with SipHash
/// (~150–250 instructions for an identity of a few bytes), and an update
/// looks identities up a dozen times. Here an identity's bytes are hashed
/// with a seeded multiply-mix hash (`IDHash`, ~20–40 instructions), each
/// entry keeps 32 bits of its hash (a probe compares those before the
/// strings; growing never hashes again), and the slots are 4-byte indices
/// into dense arrays of keys and values.
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
        var keys: [String] = []
        var values: [Value] = []
        var hashes: [UInt32] = []
        /// Index into the dense arrays, or -1 (empty). A power of two.
        var slots: [Int32] = []

        init() {}

        func copy() -> Storage {
            let c = Storage()
            c.keys = keys
            c.values = values
            c.hashes = hashes
            c.slots = slots
            return c
        }

        /// The slot holding `key` (or the empty slot where it would go) and its entry.
        @inline(__always)
        func find(_ key: String, _ h: UInt32) -> (slot: Int, entry: Int?) {
            let mask = slots.count - 1
            var i = Int(h) & mask
            while true {
                let e = Int(slots[i])
                if e < 0 { return (i, nil) }
                if hashes[e] == h && keys[e] == key { return (i, e) }
                i = (i + 1) & mask
            }
        }

        /// Places every entry again in `size` slots, by the hashes it kept.
        func resize(_ size: Int) {
            slots = [Int32](repeating: -1, count: size)
            let mask = size - 1
            for e in hashes.indices {
                var i = Int(hashes[e]) & mask
                while slots[i] >= 0 { i = (i + 1) & mask }
                slots[i] = Int32(e)
            }
        }

        /// Room for one more entry; returns where `key` is or would go.
        @inline(__always)
        func prepareInsert(_ key: String, _ h: UInt32) -> (slot: Int, entry: Int?) {
            if (keys.count + 1) * 2 > slots.count { resize(Swift.max(8, slots.count * 2)) }
            return find(key, h)
        }

        func append(_ key: String, _ value: Value, _ h: UInt32, at slot: Int) {
            slots[slot] = Int32(keys.count)
            keys.append(key)
            values.append(value)
            hashes.append(h)
        }

        func remove(slot: Int, entry: Int) -> Value {
            let mask = slots.count - 1
            // Backward-shift deletion: later entries of the run move up to stay reachable.
            var hole = slot
            var j = (hole + 1) & mask
            while slots[j] >= 0 {
                let home = Int(hashes[Int(slots[j])]) & mask
                // Move j into the hole when its home is not in (hole, j] (cyclically).
                if (j > hole && (home <= hole || home > j)) || (j < hole && (home <= hole && home > j)) {
                    slots[hole] = slots[j]
                    hole = j
                }
                j = (j + 1) & mask
            }
            slots[hole] = -1
            // The dense arrays stay dense: the last entry moves into the removed one's place.
            let last = keys.count - 1
            let old = values[entry]
            if entry != last {
                var k = Int(hashes[last]) & mask
                while Int(slots[k]) != last { k = (k + 1) & mask }
                slots[k] = Int32(entry)
                keys.swapAt(entry, last)
                values.swapAt(entry, last)
                hashes.swapAt(entry, last)
            }
            keys.removeLast()
            values.removeLast()
            hashes.removeLast()
            if slots.count > 16 && keys.count * 8 < slots.count { resize(slots.count / 2) }
            return old
        }
    }

    init() {}

    var count: Int { storage?.keys.count ?? 0 }
    var isEmpty: Bool { count == 0 }
    /// The keys in iteration order.
    var keys: [String] { storage?.keys ?? [] }
    var values: [Value] { storage?.values ?? [] }

    /// The storage, unshared, for a mutation.
    @inline(__always)
    private mutating func unique() -> Storage {
        if storage == nil {
            storage = Storage()
        } else if !isKnownUniquelyReferenced(&storage!) {
            storage = storage!.copy()
        }
        return storage!
    }

    /// Where `key` lies in the dense order.
    @inline(__always)
    func index(of key: String) -> Int? {
        guard let s = storage, !s.keys.isEmpty else { return nil }
        return s.find(key, IDHash.of(key)).entry
    }

    func contains(_ key: String) -> Bool { index(of: key) != nil }

    subscript(key: String) -> Value? {
        get {
            guard let s = storage, !s.keys.isEmpty else { return nil }
            return s.find(key, IDHash.of(key)).entry.map { s.values[$0] }
        }
        set {
            if let newValue { updateValue(newValue, forKey: key) } else { removeValue(forKey: key) }
        }
    }

    /// Sets the value; returns the old one (nil: `key` is new).
    @discardableResult
    mutating func updateValue(_ value: Value, forKey key: String) -> Value? {
        let s = unique()
        let h = IDHash.of(key)
        let (slot, entry) = s.prepareInsert(key, h)
        if let entry {
            let old = s.values[entry]
            s.values[entry] = value
            return old
        }
        s.append(key, value, h, at: slot)
        return nil
    }

    /// Adds `key` unless present; returns whether it was absent.
    @discardableResult
    mutating func insert(_ key: String, _ value: Value) -> Bool {
        let s = unique()
        let h = IDHash.of(key)
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
        let h = IDHash.of(key)
        var (slot, found) = s.prepareInsert(key, h)
        if found == nil {
            s.append(key, initial(), h, at: slot)
            found = s.keys.count - 1
        }
        let entry = found!
        if body(&s.values[entry]) { return true }
        _ = s.remove(slot: slot, entry: entry)
        return false
    }

    @discardableResult
    mutating func removeValue(forKey key: String) -> Value? {
        guard storage != nil, !storage!.keys.isEmpty else { return nil }
        // Found before `unique()` (an absent key copies nothing); a copy has
        // the same slots and entries, so the place found holds in it too.
        let (slot, found) = storage!.find(key, IDHash.of(key))
        guard let entry = found else { return nil }
        return unique().remove(slot: slot, entry: entry)
    }

    mutating func removeAll(keepingCapacity: Bool = false) {
        guard storage != nil else { return }
        guard keepingCapacity else {
            storage = nil
            return
        }
        let s = unique()
        s.keys.removeAll(keepingCapacity: true)
        s.values.removeAll(keepingCapacity: true)
        s.hashes.removeAll(keepingCapacity: true)
        for i in s.slots.indices { s.slots[i] = -1 }
    }

    mutating func reserveCapacity(_ n: Int) {
        let s = unique()
        var size = Swift.max(8, s.slots.count)
        while n * 2 > size { size *= 2 }
        if size > s.slots.count { s.resize(size) }
        s.keys.reserveCapacity(n)
        s.values.reserveCapacity(n)
        s.hashes.reserveCapacity(n)
    }

    /// Slots allocated (for tests of growth and shrinking).
    var capacity: Int { storage?.slots.count ?? 0 }
}

extension IDTable: Sequence {
    struct Iterator: IteratorProtocol {
        fileprivate let storage: Storage?
        fileprivate var i = 0
        mutating func next() -> (key: String, value: Value)? {
            guard let s = storage, i < s.keys.count else { return nil }
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

    @inline(__always)
    static func of(_ key: String) -> UInt32 {
        var s = key
        return s.withUTF8 { of(UnsafeRawBufferPointer($0)) }
    }

    static func of(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
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
