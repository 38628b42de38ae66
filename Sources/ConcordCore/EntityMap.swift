import ConcordJSON

/// Values by identity, in the order the identities were first added: the
/// entities one update carries.
///
/// Why not `[String: JSON]` and a `Set` beside it: an update carries a few
/// entities, and a dictionary that grows from empty allocates and rehashes
/// as it does and hashes every identity each time it is read. A short map
/// is searched in place (identities compared, not hashed); past 16 entries
/// it keeps an index.
struct EntityMap: Sequence {
    private var entries: [(id: String, value: JSON)] = []
    /// Past 16 entries: where each identity is (by bytes, as the short list compares).
    private var index: IDTable<Int>? = nil

    init() {}

    var count: Int { entries.count }
    var isEmpty: Bool { entries.isEmpty }

    /// The identities in the order they were first added.
    var ids: LazyMapSequence<[(id: String, value: JSON)], String> { entries.lazy.map(\.id) }

    @inline(__always)
    private func position(_ id: String) -> Int? {
        if let index { return index[id] }
        for i in entries.indices where sameText(entries[i].id, id) { return i }
        return nil
    }

    func contains(_ id: String) -> Bool { position(id) != nil }

    /// Where `id` is in the order of addition.
    func index(of id: String) -> Int? { position(id) }

    /// The `i`th identity added.
    func id(at i: Int) -> String { entries[i].id }

    /// Each value in the order of addition, read in place.
    @inline(__always)
    func forEachValue(_ body: (JSON) -> Void) {
        entries.withUnsafeBufferPointer { b in
            for i in b.indices { body(b[i].value) }
        }
    }

    /// Each identity in the order of addition, read in place (the entry's
    /// value is neither copied nor retained).
    @inline(__always)
    func forEachID(_ body: (String) -> Void) {
        entries.withUnsafeBufferPointer { b in
            for i in b.indices { body(b[i].id) }
        }
    }
    func value(at i: Int) -> JSON { entries[i].value }

    subscript(id: String) -> JSON? { position(id).map { entries[$0].value } }

    /// Sets `id`'s value (an identity already present keeps its place).
    /// Returns whether `id` is new.
    @discardableResult
    mutating func set(_ id: String, _ value: JSON) -> Bool {
        if let i = position(id) {
            entries[i].value = value
            return false
        }
        if index != nil {
            index![id] = entries.count
        } else if entries.count == 16 {
            var built = IDTable<Int>()
            built.reserveCapacity(32)
            for i in entries.indices { built[entries[i].id] = i }
            built[id] = entries.count
            index = built
        } else if entries.isEmpty {
            // Room for a few: an update of an entity and the ones it holds
            // (a post with its author) grows the list once, not twice.
            entries.reserveCapacity(4)
        }
        entries.append((id, value))
        return true
    }

    /// Whether some identity of `self` is in `set`.
    func intersects(_ set: Set<String>) -> Bool {
        for e in entries where set.contains(e.id) { return true }
        return false
    }

    func makeIterator() -> IndexingIterator<[(id: String, value: JSON)]> { entries.makeIterator() }

    /// Empties a short map, keeping its storage: whether it is worth
    /// reusing. (Shared storage would be copied empty; the caller gives
    /// back a map nothing else holds.)
    mutating func emptiedForReuse() -> Bool {
        guard index == nil, entries.capacity <= 64, !entries.isEmpty else { return false }
        // Element by element in this module's code (`removeAll(keepingCapacity:)`
        // went through the generic `replaceSubrange`, ~75 instructions and a
        // generic destroy of the pairs).
        entries.drain()
        return true
    }
}
