/// An object a ``NameTable`` finds by a string the object itself holds.
protocol Named: AnyObject {
    var tableName: String { get }
}

/// A hash table of objects keyed by a name each object holds: a
/// connection's subscriptions by name, the key and collection views by key.
///
/// Why not `[String: Object]`: a dictionary bucket holds the key (16 bytes)
/// beside the reference (8), so every name is stored twice and a million
/// subscriptions spend 32–64 bytes each on one index. Here a bucket is one
/// reference (8 bytes, nil when empty) and the name is read from the object.
/// Open addressing with linear probing, at most 3/4 full, backward-shift
/// deletion (no tombstones), shrunk when it falls under 1/8 full so memory
/// comes back when clients leave. Iteration order is the bucket order: not
/// meaningful (callers that emit output sort first).
struct NameTable<Element: Named> {
    private var buckets: [Element?] = []
    private(set) var count = 0

    init() {}

    var isEmpty: Bool { count == 0 }

    /// Buckets allocated (for tests of growth and shrinking).
    var capacity: Int { buckets.count }

    @inline(__always)
    private static func home(_ name: String, _ mask: Int) -> Int { Int(IDHash.of(name)) & mask }

    /// The index of `name`'s bucket, or nil.
    private func find(_ name: String) -> Int? {
        guard count > 0 else { return nil }
        let mask = buckets.count - 1
        var i = Self.home(name, mask)
        while let e = buckets[i] {
            if e.tableName == name { return i }
            i = (i + 1) & mask
        }
        return nil
    }

    subscript(name: String) -> Element? {
        get {
            guard let i = find(name) else { return nil }
            return buckets[i]
        }
        set {
            if let newValue {
                precondition(newValue.tableName == name, "NameTable: an element is stored under its own name")
                insert(newValue)
            } else {
                removeValue(forKey: name)
            }
        }
    }

    /// Inserts `e` under `e.tableName`, replacing an element of that name.
    mutating func insert(_ e: Element) {
        if let i = find(e.tableName) {
            buckets[i] = e
            return
        }
        if (count + 1) * 4 > buckets.count * 3 { resize(to: Swift.max(8, buckets.count * 2)) }
        let mask = buckets.count - 1
        var i = Self.home(e.tableName, mask)
        while buckets[i] != nil { i = (i + 1) & mask }
        buckets[i] = e
        count += 1
    }

    @discardableResult
    mutating func removeValue(forKey name: String) -> Element? {
        guard var hole = find(name) else { return nil }
        let removed = buckets[hole]
        buckets[hole] = nil
        count -= 1
        // Backward shift: move later members of the probe run into the hole
        // when the hole lies between their home and where they sit.
        let mask = buckets.count - 1
        var j = (hole + 1) & mask
        while let e = buckets[j] {
            let h = Self.home(e.tableName, mask)
            let movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j)
            if movable {
                buckets[hole] = e
                buckets[j] = nil
                hole = j
            }
            j = (j + 1) & mask
        }
        if buckets.count > 8 && count * 8 < buckets.count { resize(to: Swift.max(8, buckets.count / 4)) }
        return removed
    }

    mutating func removeAll() {
        buckets = []
        count = 0
    }

    private mutating func resize(to n: Int) {
        let old = buckets
        buckets = [Element?](repeating: nil, count: n)
        let mask = n - 1
        for case let e? in old {
            var i = Self.home(e.tableName, mask)
            while buckets[i] != nil { i = (i + 1) & mask }
            buckets[i] = e
        }
    }

    /// Every element, in bucket order.
    var values: [Element] {
        var out: [Element] = []
        out.reserveCapacity(count)
        for case let e? in buckets { out.append(e) }
        return out
    }
}

extension SubscriptionRecord: Named {
    var tableName: String { name }
}

extension KeyView: Named {
    var tableName: String { key }
}

extension CollectionView: Named {
    var tableName: String { name }
}
