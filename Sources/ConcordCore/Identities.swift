import ConcordJSON

/// Interned entity identities, one table for the store and the live
/// queries: each entity in memory has a 32-bit **handle**, and a handle
/// indexes columns — the identity's text (stored once), the store's record,
/// and the live queries' place for it (its slot in its type's entity list,
/// −1 when no query lists it). The store's records by identity are this
/// table (`Store.entities`); the query structures — a type's entity list,
/// its value and range indexes, every view's ordered members, the views an
/// entity is a member of (``Memberships``, a column of its own) — hold
/// handles, not `String`s: 4 bytes instead of 16 per place, integer hashing
/// and comparison, and no second table of the same texts.
///
/// A handle lives while the store holds the entity's record **or** a query
/// lists it: an entity the store removes stays interned until the queries
/// unlist it (they see the deletion after the store has made it), and one
/// the queries unlist stays while its record does. Then it is freed and
/// reused (the last freed first).
///
/// Layout: columns in memory the table manages (no `Array`: an access to
/// an array held by a class retains and releases its buffer), grown by half
/// (columns as long as the store waste less than doubled ones), with the
/// identity's 32-bit hash (`IDHash`) kept per handle so a probe compares
/// texts only on a hash match and growing never hashes again; an
/// open-addressed table of `handle + 1` (0 = empty), at most 3/4 full,
/// linear probing, backward-shift deletion. About 33 bytes per entity
/// (text 16, record 8, hash 4, type slot 4, its table slot ~5–11), plus the
/// text when it is over 15 bytes. A live handle's text is never empty (an
/// entity identity is `Type:id`); a free handle's is.
///
/// Handles are given in a fixed order for the same operations, so
/// iteration (handle order, over the handles with a record) is the same on
/// every run for the same operations, but not meaningful: callers that
/// emit output sort first.
final class Identities {
    /// Marks a handle that is not in use.
    static let none = UInt32.max

    // Columns by handle; `0..<columns` are initialized.
    private var names: UnsafeMutablePointer<String>
    private var records: UnsafeMutablePointer<EntityRecord?>
    private var hashes: UnsafeMutablePointer<UInt32>
    /// The live queries' slot for each handle: its place in its type's
    /// entity list, −1 when it is not listed. Moves within a list write it
    /// directly; listing and unlisting go through ``list(_:slot:)`` and
    /// ``unlist(_:)``, which keep the handle alive.
    private(set) var typeSlot: UnsafeMutablePointer<Int32>
    private var columns = 0
    private var columnCapacity = 0
    private var table: UnsafeMutablePointer<UInt32>
    private var tableCount = 0
    private var free: [UInt32] = []
    /// Live handles.
    private(set) var handles = 0
    /// Records held (the store's resident entities).
    private(set) var count = 0
    /// Handles the live queries list.
    private(set) var listed = 0
    private let seed = IDHash.seed

    init() {
        names = .allocate(capacity: 0)
        records = .allocate(capacity: 0)
        hashes = .allocate(capacity: 0)
        typeSlot = .allocate(capacity: 0)
        table = .allocate(capacity: 0)
    }

    deinit {
        releaseMemory()
    }

    private func releaseMemory() {
        names.deinitialize(count: columns)
        records.deinitialize(count: columns)
        names.deallocate()
        records.deallocate()
        hashes.deallocate()
        typeSlot.deallocate()
        table.deallocate()
    }

    @inline(__always)
    private func hash(_ id: String) -> UInt32 { IDHash.of(id, seed: seed) }

    /// The text of a live handle.
    @inline(__always)
    func name(_ h: UInt32) -> String { names[Int(h)] }

    /// Handles made, live or free: columns indexed by handle need this many entries.
    var capacity: Int { columns }

    /// The capacity of the columns (what a column kept beside them reserves).
    var reservedCapacity: Int { columnCapacity }

    var isEmpty: Bool { count == 0 }

    /// The handle of `id`, nil when it has none.
    @inline(__always)
    func find(_ id: String) -> UInt32? {
        guard handles > 0 else { return nil }
        return locate(id, hash(id)).handle
    }

    /// The table slot holding `id` (or the empty one where it would go) and its handle.
    @inline(__always)
    private func locate(_ id: String, _ h: UInt32) -> (slot: Int, handle: UInt32?) {
        let mask = tableCount &- 1
        var i = Int(h) & mask
        while true {
            let s = table[i]
            if s == 0 { return (i, nil) }
            let e = Int(s &- 1)
            if hashes[e] == h && sameText(names[e], id) { return (i, s &- 1) }
            i = (i &+ 1) & mask
        }
    }

    /// The handle of `id`, made when it has none (it then holds nothing:
    /// the caller gives it a record or a listing before anything else runs).
    func intern(_ id: String) -> UInt32 {
        let h = hash(id)
        if handles > 0, let known = locate(id, h).handle { return known }
        if (handles + 1) * 4 > tableCount * 3 { resize(Swift.max(16, tableCount * 2)) }
        let handle: UInt32
        if let f = free.popLast() {
            handle = f
            names[Int(f)] = id
        } else {
            if columns == columnCapacity { growColumns(to: Self.grownByHalf(columns)) }
            handle = UInt32(columns)
            (names + columns).initialize(to: id)
            (records + columns).initialize(to: nil)
            columns += 1
        }
        hashes[Int(handle)] = h
        typeSlot[Int(handle)] = -1
        let slot = locate(id, h).slot
        table[slot] = handle &+ 1
        handles += 1
        return handle
    }

    /// Frees a handle that holds neither a record nor a listing.
    private func release(_ handle: UInt32) {
        let mask = tableCount - 1
        var i = Int(hashes[Int(handle)]) & mask
        while table[i] != handle &+ 1 { i = (i + 1) & mask }
        // Backward-shift deletion: later entries of the run move up to stay reachable.
        var hole = i
        var j = (hole + 1) & mask
        while table[j] != 0 {
            let home = Int(hashes[Int(table[j] - 1)]) & mask
            if movesIntoHole(home: home, hole: hole, slot: j) {
                table[hole] = table[j]
                hole = j
            }
            j = (j + 1) & mask
        }
        table[hole] = 0
        names[Int(handle)] = ""
        handles -= 1
        if handles == 0 {
            // Nothing is interned: the columns and the table go.
            releaseMemory()
            names = .allocate(capacity: 0)
            records = .allocate(capacity: 0)
            hashes = .allocate(capacity: 0)
            typeSlot = .allocate(capacity: 0)
            table = .allocate(capacity: 0)
            columns = 0
            columnCapacity = 0
            tableCount = 0
            free = []
        } else {
            free.append(handle)
        }
    }

    private func resize(_ size: Int) {
        table.deallocate()
        table = .allocate(capacity: size)
        table.initialize(repeating: 0, count: size)
        tableCount = size
        let mask = size - 1
        for handle in 0..<columns where !names[handle].isEmpty {
            var i = Int(hashes[handle]) & mask
            while table[i] != 0 { i = (i + 1) & mask }
            table[i] = UInt32(handle) + 1
        }
    }

    private func growColumns(to n: Int) {
        func moved<T>(_ p: UnsafeMutablePointer<T>) -> UnsafeMutablePointer<T> {
            let q = UnsafeMutablePointer<T>.allocate(capacity: n)
            q.moveInitialize(from: p, count: columns)
            p.deallocate()
            return q
        }
        names = moved(names)
        records = moved(records)
        hashes = moved(hashes)
        typeSlot = moved(typeSlot)
        columnCapacity = n
    }

    /// The capacity a full column of `count` grows to: by half, not
    /// doubled (columns as long as a type's entities waste less).
    static func grownByHalf(_ count: Int) -> Int { Swift.max(16, count + count / 2) }

    // MARK: The store's records

    /// The record of a handle (nil: the queries list it, the store does not hold it).
    @inline(__always)
    func record(_ h: UInt32) -> EntityRecord? { records[Int(h)] }

    /// The store's record of `id`.
    subscript(id: String) -> EntityRecord? {
        get {
            guard handles > 0, let h = locate(id, hash(id)).handle else { return nil }
            return records[Int(h)]
        }
        set {
            if let newValue {
                let h = Int(intern(id))
                if records[h] == nil { count += 1 }
                records[h] = newValue
            } else {
                removeValue(forKey: id)
            }
        }
    }

    /// Takes the store's record of `id` out; the handle goes with it unless a query lists it.
    @discardableResult
    func removeValue(forKey id: String) -> EntityRecord? {
        guard let h = find(id), let old = records[Int(h)] else { return nil }
        records[Int(h)] = nil
        count -= 1
        if typeSlot[Int(h)] < 0 { release(h) }
        return old
    }

    /// Takes every record out (the handles the queries list stay).
    func removeAllRecords() {
        for h in 0..<columns where records[h] != nil {
            records[h] = nil
            count -= 1
            if typeSlot[h] < 0 { release(UInt32(h)) }
            if handles == 0 { break }
        }
    }

    /// The identities with a record, in handle order.
    var keys: [String] {
        var out: [String] = []
        out.reserveCapacity(count)
        for h in 0..<columns where records[h] != nil { out.append(names[h]) }
        return out
    }

    var values: [EntityRecord] {
        var out: [EntityRecord] = []
        out.reserveCapacity(count)
        for h in 0..<columns { if let r = records[h] { out.append(r) } }
        return out
    }

    // MARK: The live queries' listing

    /// Whether a query lists the handle.
    @inline(__always)
    func isListed(_ h: UInt32) -> Bool { typeSlot[Int(h)] >= 0 }

    /// Lists a handle at `slot` of its type's entity list (it was not listed).
    func list(_ h: UInt32, slot: Int32) {
        typeSlot[Int(h)] = slot
        listed += 1
    }

    /// Moves a listed handle to another slot of its type's list.
    @inline(__always)
    func move(_ h: UInt32, toSlot slot: Int32) { typeSlot[Int(h)] = slot }

    /// Unlists a handle; it is freed unless the store holds its record.
    func unlist(_ h: UInt32) {
        typeSlot[Int(h)] = -1
        listed -= 1
        if records[Int(h)] == nil { release(h) }
    }

    /// Unlists every handle (the queries are cleared).
    func unlistAll() {
        var h = 0
        while listed > 0 && h < columns {
            if !names[h].isEmpty && typeSlot[h] >= 0 { unlist(UInt32(h)) }
            h += 1
        }
    }

    /// What is wrong with the table (for tests and the internal checks).
    func violations() -> [String] {
        var problems: [String] = []
        var live = 0, recs = 0, lists = 0
        for h in 0..<columns where !names[h].isEmpty {
            live += 1
            if records[h] != nil { recs += 1 }
            if typeSlot[h] >= 0 { lists += 1 }
            if records[h] == nil && typeSlot[h] < 0 { problems.append("identities: \(names[h]) holds neither a record nor a listing") }
            if find(names[h]) != UInt32(h) { problems.append("identities: \(names[h]) is not found at its handle \(h)") }
        }
        if live != handles { problems.append("identities: \(live) named handles, \(handles) counted") }
        if live + free.count != columns { problems.append("identities: \(live) live + \(free.count) free of \(columns)") }
        if recs != count { problems.append("identities: \(recs) records, \(count) counted") }
        if lists != listed { problems.append("identities: \(lists) listed, \(listed) counted") }
        return problems
    }
}

extension Identities: Sequence {
    struct Iterator: IteratorProtocol {
        fileprivate let table: Identities
        fileprivate var h = 0
        mutating func next() -> (key: String, value: EntityRecord)? {
            while h < table.columns {
                defer { h += 1 }
                if let r = table.records[h] { return (table.names[h], r) }
            }
            return nil
        }
    }

    func makeIterator() -> Iterator { Iterator(table: self) }
    var underestimatedCount: Int { count }
}
