import ConcordJSON

/// Interned identities: each entity a live query's structures hold gets a
/// 32-bit **handle** once, when its type's query index first lists it, and
/// keeps it until it leaves that index (deleted, or the type's last view
/// gone). The query structures — the type's entity list, its value and
/// range indexes, every view's ordered members, the views an entity is a
/// member of — hold handles, not `String`s: 4 bytes instead of 16 per
/// place, integer hashing and comparison, and the identity's text stored
/// once (`name(_:)`).
///
/// Layout: dense columns indexed by handle (the text, and the caller's slot
/// in its type's list), grown by half, a free list of handles to reuse, and
/// an open-addressed table of `handle + 1` (0 = empty) over the texts'
/// hashes (`IDHash`, not kept: a probe compares texts with `sameText`,
/// two words for most identities), at most 3/4 full, linear probing,
/// backward-shift deletion. ~30 bytes per identity, plus its text when
/// that is over 15 bytes. A handle's text is never empty (an entity
/// identity is `Type:id`): a free handle's is.
///
/// Handles are given in a fixed order for the same operations (the lowest
/// freed one is not sought: the last freed is reused first), but nothing
/// outside this engine sees them: every output is ordered by text.
final class Identities {
    private(set) var names: [String] = []
    /// The caller's per-handle slot (the entity's place in its type's list).
    var typeSlot: [Int32] = []
    private var table: [UInt32] = []
    private var free: [UInt32] = []
    private(set) var count = 0
    private let seed = IDHash.seed

    /// Marks a handle that is not in use (its name is empty).
    static let none = UInt32.max

    @inline(__always)
    private func hash(_ id: String) -> UInt32 { IDHash.of(id, seed: seed) }

    /// The text of a live handle.
    @inline(__always)
    func name(_ h: UInt32) -> String { names[Int(h)] }

    /// How many handles exist, live or free (columns indexed by handle have this many entries).
    var capacity: Int { names.count }

    /// The handle of `id`, nil when it has none.
    func find(_ id: String) -> UInt32? {
        guard count > 0 else { return nil }
        let mask = table.count - 1
        var i = Int(hash(id)) & mask
        while true {
            let s = table[i]
            if s == 0 { return nil }
            let handle = s - 1
            if sameText(names[Int(handle)], id) { return handle }
            i = (i + 1) & mask
        }
    }

    /// A new handle for `id`, which has none.
    func insert(_ id: String) -> UInt32 {
        if (count + 1) * 4 > table.count * 3 { resize(Swift.max(16, table.count * 2)) }
        let h = hash(id)
        let handle: UInt32
        if let f = free.popLast() {
            handle = f
            names[Int(f)] = id
            typeSlot[Int(f)] = -1
        } else {
            handle = UInt32(names.count)
            if names.count == names.capacity {
                let grown = Self.grownByHalf(names.count)
                names.reserveCapacity(grown)
                typeSlot.reserveCapacity(grown)
            }
            names.append(id)
            typeSlot.append(-1)
        }
        let mask = table.count - 1
        var i = Int(h) & mask
        while table[i] != 0 { i = (i + 1) & mask }
        table[i] = handle + 1
        count += 1
        return handle
    }

    /// Gives a live handle up: its identity has none afterwards, and the
    /// handle is reused.
    func remove(_ handle: UInt32) {
        let mask = table.count - 1
        var i = Int(hash(names[Int(handle)])) & mask
        while table[i] != handle + 1 { i = (i + 1) & mask }
        // Backward-shift deletion: later entries of the run move up to stay reachable.
        var hole = i
        var j = (hole + 1) & mask
        while table[j] != 0 {
            let home = Int(hash(names[Int(table[j] - 1)])) & mask
            if movesIntoHole(home: home, hole: hole, slot: j) {
                table[hole] = table[j]
                hole = j
            }
            j = (j + 1) & mask
        }
        table[hole] = 0
        names[Int(handle)] = ""
        typeSlot[Int(handle)] = -1
        free.append(handle)
        count -= 1
        if count == 0 { removeAll() }
    }

    func removeAll() {
        names = []
        typeSlot = []
        table = []
        free = []
        count = 0
    }

    private func resize(_ size: Int) {
        table = [UInt32](repeating: 0, count: size)
        let mask = size - 1
        for handle in names.indices where !names[handle].isEmpty {
            var i = Int(hash(names[handle])) & mask
            while table[i] != 0 { i = (i + 1) & mask }
            table[i] = UInt32(handle) + 1
        }
    }

    /// The capacity a full column of `count` grows to: by half, not
    /// doubled (columns as long as a type's entities waste less).
    static func grownByHalf(_ count: Int) -> Int { Swift.max(16, count + count / 2) }

    /// What is wrong with the table (for tests and the internal checks).
    func violations() -> [String] {
        var problems: [String] = []
        let live = names.indices.filter { !names[$0].isEmpty }
        if live.count != count { problems.append("identities: \(live.count) named handles, \(count) counted") }
        if live.count + free.count != names.count { problems.append("identities: \(live.count) live + \(free.count) free of \(names.count)") }
        for handle in live where find(names[handle]) != UInt32(handle) {
            problems.append("identities: \(names[handle]) is not found at its handle \(handle)")
        }
        return problems
    }
}
