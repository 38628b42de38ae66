/// A map keyed by connection: what the engine, the sequencer and the loop
/// look up for every request they handle (a client's session, its lane, its
/// connection). `Dictionary` hashes an `Int` key with the seeded SipHash
/// (~100 instructions a lookup, five lookups per request on the hand-off
/// path); connection numbers are handed out by the server, not chosen by a
/// client, so a multiplicative hash of the number is enough here.
///
/// Open addressing, linear probing, at most half full (doubling; halved
/// when under an eighth full), removal by backward shift (no tombstones).
/// Iteration is in slot order: the same operations give the same order (a
/// `Dictionary`'s is seeded per process).
public struct ConnectionMap<Value> {
    @usableFromInline var slotKeys: [ConnectionID] = []
    @usableFromInline var slotValues: [Value?] = []
    @usableFromInline var storedCount = 0
    @inlinable public var count: Int { storedCount }
    // `@inlinable` throughout: the loop's and the sequencer's maps are in
    // another module, and an unspecialized generic lookup costs a metadata
    // lookup per call.

    /// Marks an empty slot (no connection has this number).
    @usableFromInline static var empty: ConnectionID { .min }

    @inlinable public init() {}

    @inlinable public var isEmpty: Bool { count == 0 }

    @inlinable @inline(__always)
    func home(_ id: ConnectionID, mask: Int) -> Int {
        Int(truncatingIfNeeded: (UInt64(bitPattern: Int64(id)) &* 0x9E37_79B9_7F4A_7C15) &>> 32) & mask
    }

    /// The slot holding `id`, or nil.
    @inlinable @inline(__always)
    func find(_ id: ConnectionID) -> Int? {
        guard count > 0 else { return nil }
        let mask = slotKeys.count - 1
        var i = home(id, mask: mask)
        while true {
            let k = slotKeys[i]
            if k == id { return i }
            if k == Self.empty { return nil }
            i = (i + 1) & mask
        }
    }

    @inlinable public subscript(id: ConnectionID) -> Value? {
        get {
            guard let i = find(id) else { return nil }
            return slotValues[i]
        }
        set {
            if let newValue { insert(id, newValue) } else { removeValue(forKey: id) }
        }
    }

    @inlinable mutating func insert(_ id: ConnectionID, _ value: Value) {
        precondition(id != Self.empty, "connection number \(id) is reserved")
        if let i = find(id) {
            slotValues[i] = value
            return
        }
        if (count + 1) * 2 > slotKeys.count { grow() }
        let mask = slotKeys.count - 1
        var i = home(id, mask: mask)
        while slotKeys[i] != Self.empty { i = (i + 1) & mask }
        slotKeys[i] = id
        slotValues[i] = value
        storedCount += 1
    }

    @inlinable @discardableResult
    public mutating func removeValue(forKey id: ConnectionID) -> Value? {
        guard let found = find(id) else { return nil }
        let removed = slotValues[found]
        let mask = slotKeys.count - 1
        // Backward shift: later entries of the run move up to stay reachable.
        var hole = found
        var j = (hole + 1) & mask
        while slotKeys[j] != Self.empty {
            if movesIntoHole(home: home(slotKeys[j], mask: mask), hole: hole, slot: j) {
                slotKeys[hole] = slotKeys[j]
                slotValues[hole] = slotValues[j]
                hole = j
            }
            j = (j + 1) & mask
        }
        slotKeys[hole] = Self.empty
        slotValues[hole] = nil
        storedCount -= 1
        // A table that once held many connections does not stay that large.
        if slotKeys.count > 64 && storedCount * 8 < slotKeys.count { resize(slotKeys.count / 2) }
        return removed
    }

    @inlinable public mutating func removeAll() {
        slotKeys = []
        slotValues = []
        storedCount = 0
    }

    @inlinable mutating func grow() { resize(Swift.max(8, slotKeys.count * 2)) }

    @inlinable mutating func resize(_ size: Int) {
        let oldKeys = slotKeys
        let oldValues = slotValues
        slotKeys = [ConnectionID](repeating: Self.empty, count: size)
        slotValues = [Value?](repeating: nil, count: size)
        let mask = size - 1
        for s in oldKeys.indices where oldKeys[s] != Self.empty {
            var i = home(oldKeys[s], mask: mask)
            while slotKeys[i] != Self.empty { i = (i + 1) & mask }
            slotKeys[i] = oldKeys[s]
            slotValues[i] = oldValues[s]
        }
    }

    /// The connection numbers, in slot order.
    @inlinable public var keys: [ConnectionID] { slotKeys.filter { $0 != Self.empty } }

    /// The values, in slot order.
    @inlinable public var values: [Value] { slotValues.compactMap { $0 } }
}

extension ConnectionMap: Sequence {
    public struct Iterator: IteratorProtocol {
        @usableFromInline let keys: [ConnectionID]
        @usableFromInline let values: [Value?]
        @usableFromInline var i = 0

        @inlinable init(keys: [ConnectionID], values: [Value?]) {
            self.keys = keys
            self.values = values
        }

        @inlinable public mutating func next() -> (key: ConnectionID, value: Value)? {
            while i < keys.count {
                defer { i += 1 }
                if keys[i] != ConnectionMap.empty, let v = values[i] { return (keys[i], v) }
            }
            return nil
        }
    }

    @inlinable public func makeIterator() -> Iterator { Iterator(keys: slotKeys, values: slotValues) }

    @inlinable public var underestimatedCount: Int { count }
}

extension ConnectionMap: Sendable where Value: Sendable {}

extension ConnectionMap: ExpressibleByDictionaryLiteral {
    @inlinable public init(dictionaryLiteral elements: (ConnectionID, Value)...) {
        self.init()
        for (k, v) in elements { self[k] = v }
    }
}
