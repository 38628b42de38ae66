import ConcordJSON

/// A value a ``NameTable`` finds by a string the value itself holds.
protocol Named {
    var tableName: String { get }
}

/// A hash table of values keyed by a name each value holds: a connection's
/// subscriptions by name, the key and collection views by key.
///
/// Why not `[String: Object]`: a dictionary bucket holds the key (16 bytes)
/// beside the reference (8), so every name is stored twice and a million
/// subscriptions spend 32–64 bytes each on one index. Here a bucket is one
/// reference (8 bytes, nil when empty) and the name is read from the value,
/// plus one tag byte: 7 bits of the name's hash (0 empty, 1 a removed
/// entry). A probe compares tags and reads a value only when its tag
/// matches (1 in 128 otherwise), so the table can be 7/8 full — a million
/// names in 2^20 buckets, 9 bytes each. Open addressing with linear
/// probing; removal leaves a tombstone (O(1), no name hashed again), which
/// insertion reuses and a rehash clears. Buckets and tags are allocated at
/// exactly their size (a power of two bytes, a jemalloc size class of
/// their own: an `Array`'s 32-byte header would round a 2 MiB table up to
/// 2.5 MiB). It shrinks when under 1/8 full, so memory comes back when
/// clients leave. Iteration order is the bucket order: not meaningful
/// (callers that emit output sort first).
struct NameTable<Element: Named> {
    private final class Storage {
        let capacity: Int
        let buckets: UnsafeMutablePointer<Element?>
        /// 0: empty; 1: removed (a tombstone); else 0x80 | 7 bits of the hash.
        let tags: UnsafeMutablePointer<UInt8>
        var count = 0
        var tombstones = 0

        init(capacity: Int) {
            self.capacity = capacity
            buckets = .allocate(capacity: capacity)
            buckets.initialize(repeating: nil, count: capacity)
            tags = .allocate(capacity: capacity)
            tags.initialize(repeating: 0, count: capacity)
        }

        deinit {
            buckets.deinitialize(count: capacity)
            buckets.deallocate()
            tags.deallocate()
        }

        /// `IDHash.seed` (the same in every table), kept here: reading the
        /// static goes through `swift_once`.
        let seed = IDHash.seed

        /// The element named `name`. (A method of the storage, called
        /// through the table's optional: the storage is borrowed, not
        /// retained and released around the lookup.)
        @inline(__always)
        func element(_ name: String) -> Element? {
            find(name, IDHash.of(name, seed: seed)).flatMap { buckets[$0] }
        }

        /// The index of `name`'s bucket, or nil.
        @inline(__always)
        func find(_ name: String, _ h: UInt32) -> Int? {
            guard count > 0 else { return nil }
            let mask = capacity - 1
            let tag = NameTable.tag(h)
            var i = Int(h) & mask
            while true {
                let t = tags[i]
                if t == NameTable.empty { return nil }
                if t == tag, let e = buckets[i], sameText(e.tableName, name) { return i }
                i = (i + 1) & mask
            }
        }
    }

    private var storage: Storage?

    init() {}

    var count: Int { storage?.count ?? 0 }

    var isEmpty: Bool { count == 0 }

    /// Buckets allocated (for tests of growth and shrinking).
    var capacity: Int { storage?.capacity ?? 0 }

    fileprivate static var empty: UInt8 { 0 }
    private static var removed: UInt8 { 1 }

    @inline(__always)
    fileprivate static func tag(_ h: UInt32) -> UInt8 { UInt8(truncatingIfNeeded: h >> 25) | 0x80 }

    /// The index of `name`'s bucket, or nil.
    @inline(__always)
    private func find(_ name: String, _ h: UInt32) -> Int? {
        storage?.find(name, h)
    }

    subscript(name: String) -> Element? {
        get { storage?.element(name) }
        set {
            if let newValue {
                precondition(newValue.tableName == name, "NameTable: an element is stored under its own name")
                insert(newValue)
            } else {
                removeValue(forKey: name)
            }
        }
    }

    private mutating func makeUnique() {
        // No binding of `storage` before the check: it would be a second reference.
        if storage != nil && !isKnownUniquelyReferenced(&storage) {
            storage = Self.copy(storage!, capacity: storage!.capacity)
        }
    }

    /// Inserts `e` under `e.tableName`, replacing an element of that name.
    mutating func insert(_ e: Element) {
        let name = e.tableName
        let h = IDHash.of(name)
        makeUnique()
        if let i = find(name, h) {
            storage!.buckets[i] = e
            return
        }
        var st: Storage
        if let s = storage {
            st = s
        } else {
            st = Storage(capacity: 8)
            storage = st
        }
        if (st.count + st.tombstones + 1) * 8 > st.capacity * 7 {
            // Mostly tombstones: rehash at this size; else double.
            let n = st.count * 2 < st.capacity ? st.capacity : st.capacity * 2
            st = Self.copy(st, capacity: n)
            storage = st
        }
        let mask = st.capacity - 1
        var i = Int(h) & mask
        while st.tags[i] > Self.removed { i = (i + 1) & mask }
        if st.tags[i] == Self.removed { st.tombstones -= 1 }
        st.tags[i] = Self.tag(h)
        st.buckets[i] = e
        st.count += 1
    }

    @discardableResult
    mutating func removeValue(forKey name: String) -> Element? {
        let h = IDHash.of(name)
        guard var i = find(name, h) else { return nil }
        if !isKnownUniquelyReferenced(&storage) {
            makeUnique()
            i = find(name, h)!
        }
        let st = storage!
        let removed = st.buckets[i]
        st.buckets[i] = nil
        st.count -= 1
        if st.count == 0 {
            storage = nil
            return removed
        }
        // A tombstone keeps later members of the probe run reachable; an
        // empty bucket next does not need one.
        if st.tags[(i + 1) & (st.capacity - 1)] == Self.empty {
            st.tags[i] = Self.empty
        } else {
            st.tags[i] = Self.removed
            st.tombstones += 1
        }
        if st.capacity > 8 && st.count * 8 < st.capacity {
            storage = Self.copy(st, capacity: Swift.max(8, st.capacity / 4))
        }
        return removed
    }

    mutating func removeAll() {
        storage = nil
    }

    /// `st`'s elements in a new storage of `capacity` buckets (no tombstones).
    private static func copy(_ st: Storage, capacity: Int) -> Storage {
        let n = Storage(capacity: capacity)
        let mask = capacity - 1
        for j in 0..<st.capacity where st.tags[j] > removed {
            let e = st.buckets[j]!
            let h = IDHash.of(e.tableName)
            var i = Int(h) & mask
            while n.tags[i] != empty { i = (i + 1) & mask }
            n.tags[i] = tag(h)
            n.buckets[i] = e
        }
        n.count = st.count
        return n
    }

    /// Every element, in bucket order.
    var values: [Element] {
        guard let st = storage else { return [] }
        var out: [Element] = []
        out.reserveCapacity(st.count)
        for j in 0..<st.capacity where st.tags[j] > Self.removed { out.append(st.buckets[j]!) }
        return out
    }
}

extension SubscriptionRecord: Named {
    var tableName: String { name }
}

extension CollectionView: Named {
    var tableName: String { name }
}
