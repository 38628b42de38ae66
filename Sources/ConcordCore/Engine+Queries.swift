import ConcordJSON
import ConcordProtocol

/// The live queries of one entity type, and how an update finds its candidates.
///
/// An entity that changes is handed to (1) the views it is a member of
/// (`memberOf`), (2) the views whose equality condition its new value meets
/// (`byValue`, looked up per indexed path: a hash probe each), and (3) the
/// views whose range of one path holds its new value (`ranges`: an interval
/// tree per path, O(log n + k)), and (4) the views that cannot be indexed
/// (`unindexed`: every one of them is tested).
/// So the work of a mutation grows with the entities it changes and the
/// queries they can affect, not with the number of live queries — except
/// for unindexed ones, which cost one predicate test per changed entity of
/// their type each.
final class TypeQueries {
    /// A view filed under one value of its indexed path, and which of its
    /// values that is (so moving it within the list updates its slot in O(1)).
    struct Filed {
        unowned(unsafe) let view: QueryView  // the view unfiles itself before it goes
        let value: Int32
    }
    /// path (joined by NUL) → value key → views.
    var byValue: [String: [String: [Filed]]] = [:]
    /// path (joined by NUL) → how many views are filed under it.
    var paths: [String: (path: QueryPath, views: Int)] = [:]
    /// path (joined by NUL) → the views filed by the range of that path.
    var ranges: [String: (path: QueryPath, tree: RangeTree)] = [:]
    var unindexed: [QueryView] = []
    var viewCount = 0
    /// Every entity of the type in memory, by handle (``Identities``; each
    /// knows its place here, `Identities.typeSlot`): built on the first
    /// query of the type, kept up to date while one lives (a new definition
    /// scans it). This list owns the handles: an entity has one while it is
    /// listed here.
    var entities: [UInt32] = []
    /// path → value key → entities with that value (for building indexed
    /// views without scanning the whole type). An entity's old key is read
    /// from its value before the mutation, so none is stored per entity.
    var entitiesByValue: [String: [String: Set<UInt32>]] = [:]
    /// path (joined by NUL) → the entities ordered by that path's value,
    /// while a range view on the path lives (building range views).
    var entitiesByRange: [String: RangeEntityIndex] = [:]
}

/// One entity's membership of a query view: the view, and the node of its
/// tree that holds the entity. (Unowned: a view stays in the registry, live
/// or retiring, until every membership of it is unfiled.)
struct Membership {
    unowned(unsafe) let view: QueryView
    var node: Int32
}

/// Entity handle → the query views it is a member of, each with its node.
/// One 8-byte entry per handle: the view's number and its node when the
/// entity is in one view (most are), or the number of an overflow list
/// that holds all its memberships. Views are numbered here
/// (``register(_:)``) while they can be listed (live or retiring): 4 bytes
/// instead of an 8-byte reference, so an entry is half of what it was.
/// Each view's node knows its slot (``QueryView/Placed/slot``), so leaving
/// is O(1).
struct Memberships {
    /// `view` ≥ 0: the one membership (the view's number, its node); −1:
    /// none; ≤ −2: overflow list `−2 − view` holds them all (slot i is its
    /// element i).
    private struct Entry {
        var view: Int32 = -1
        var node: Int32 = -1
    }
    private var column: [Entry] = []
    private var overflow: [[Entry]] = []
    private var freeOverflow: [Int32] = []
    /// View number → the view (unowned: a view is unregistered before it goes).
    private var views: [Unmanaged<QueryView>?] = []
    private var freeViews: [Int32] = []
    /// Views numbered now.
    private(set) var registered = 0

    /// Handles it has an entry for.
    var handles: Int { column.count }
    var isEmpty: Bool { column.isEmpty }

    /// Numbers a view, which may then be listed.
    mutating func register(_ view: QueryView) {
        let n: Int32
        if let f = freeViews.popLast() {
            n = f
            views[Int(f)] = Unmanaged.passUnretained(view)
        } else {
            n = Int32(views.count)
            views.append(Unmanaged.passUnretained(view))
        }
        view.membershipNumber = n
        registered += 1
    }

    /// Gives a view's number back; no list may hold it any more.
    mutating func unregister(_ view: QueryView) {
        let n = view.membershipNumber
        guard n >= 0, Int(n) < views.count, views[Int(n)]?.toOpaque() == Unmanaged.passUnretained(view).toOpaque() else { return }
        views[Int(n)] = nil
        freeViews.append(n)
        view.membershipNumber = -1
        registered -= 1
    }

    /// Entries for handles `0 ..< n` (room for `reserve`, so that it grows as the handles' columns do).
    mutating func grow(to n: Int, reserve: Int) {
        guard column.count < n else { return }
        if column.capacity < n { column.reserveCapacity(Swift.max(n, reserve)) }
        while column.count < n { column.append(Entry()) }
    }

    @inline(__always)
    private func membership(_ e: Entry) -> Membership {
        Membership(view: views[Int(e.view)]!.takeUnretainedValue(), node: e.node)
    }

    /// The view number of `h`'s membership at `slot` (for the internal checks).
    func number(_ h: UInt32, slot: Int) -> Int32 {
        let e = column[Int(h)]
        return e.view >= 0 ? e.view : overflow[Int(-2 - e.view)][slot].view
    }

    /// The view numbered `n`, nil when none is (for the internal checks).
    func view(numbered n: Int32) -> QueryView? {
        n >= 0 && Int(n) < views.count ? views[Int(n)]?.takeUnretainedValue() : nil
    }

    func count(of h: UInt32) -> Int {
        let v = column[Int(h)].view
        return v >= 0 ? 1 : v == -1 ? 0 : overflow[Int(-2 - v)].count
    }

    subscript(h: UInt32, slot: Int) -> Membership {
        let e = column[Int(h)]
        return e.view >= 0 ? membership(e) : membership(overflow[Int(-2 - e.view)][slot])
    }

    func forEach(_ h: UInt32, _ body: (Membership) -> Void) {
        let e = column[Int(h)]
        if e.view >= 0 {
            body(membership(e))
        } else if e.view <= -2 {
            for m in overflow[Int(-2 - e.view)] { body(membership(m)) }
        }
    }

    /// Appends a membership of a registered view; returns its slot.
    mutating func append(_ h: UInt32, _ m: Membership) -> Int32 {
        let i = Int(h)
        let e = Entry(view: m.view.membershipNumber, node: m.node)
        let c = column[i]
        if c.view == -1 {
            column[i] = e
            return 0
        }
        if c.view >= 0 {
            // A second membership: both go to an overflow list (the first keeps slot 0).
            let k: Int32
            if let f = freeOverflow.popLast() { k = f } else {
                k = Int32(overflow.count)
                overflow.append([])
            }
            overflow[Int(k)].append(c)
            overflow[Int(k)].append(e)
            column[i] = Entry(view: -2 - k, node: -1)
            return 1
        }
        let k = Int(-2 - c.view)
        overflow[k].append(e)
        return Int32(overflow[k].count - 1)
    }

    /// Removes the membership at `slot` by moving the last one into its
    /// place; returns the one moved (now at `slot`), if any.
    mutating func remove(_ h: UInt32, at slot: Int) -> Membership? {
        let i = Int(h)
        let c = column[i]
        guard c.view <= -2 else {
            // Its only membership (slot 0).
            column[i] = Entry()
            return nil
        }
        let k = Int(-2 - c.view)
        let last = overflow[k].removeLast()
        let moved = slot < overflow[k].count
        if moved { overflow[k][slot] = last }
        // One left: back into the entry (it is at slot 0 either way).
        if overflow[k].count <= 1 { collapse(i) }
        return moved ? membership(last) : nil
    }

    /// No memberships for `h`, its overflow list kept (emptied) for
    /// appends that follow; ``trim(_:)`` lets it go if they did not need it.
    mutating func empty(_ h: UInt32) {
        let i = Int(h)
        if column[i].view <= -2 {
            overflow[Int(-2 - column[i].view)].removeAll(keepingCapacity: true)
        } else {
            column[i] = Entry()
        }
    }

    /// Lets `h`'s overflow list go when it holds one membership or none.
    mutating func trim(_ h: UInt32) {
        let i = Int(h)
        if column[i].view <= -2 && overflow[Int(-2 - column[i].view)].count <= 1 { collapse(i) }
    }

    /// No memberships for `h`.
    mutating func clear(_ h: UInt32) {
        let i = Int(h)
        if column[i].view <= -2 { releaseOverflow(Int32(-2 - column[i].view)) }
        column[i] = Entry()
    }

    /// An overflow list of at most one membership back into the entry.
    private mutating func collapse(_ i: Int) {
        let k = -2 - column[i].view
        column[i] = overflow[Int(k)].first ?? Entry()
        releaseOverflow(k)
    }

    private mutating func releaseOverflow(_ k: Int32) {
        overflow[Int(k)] = []
        freeOverflow.append(k)
    }

    /// Every list (no handle is left); the views keep their numbers.
    mutating func removeAllLists() {
        column = []
        overflow = []
        freeOverflow = []
    }

    /// Every list and every view's number (`clear`: no view is left).
    mutating func removeAll() {
        removeAllLists()
        views = []
        freeViews = []
        registered = 0
    }
}

/// Queries' state in the engine.
final class QueryRegistry {
    /// Definitions without their window → the shared ordered matches.
    var views: [String: QueryView] = [:]
    /// Definitions (window included) → what their subscribers see.
    var windows: [String: QueryWindow] = [:]
    var types: [String: TypeQueries] = [:]
    /// The handles of the entities the query structures hold: the store's
    /// table (``Store/entities``), where a listed entity's handle is its
    /// record's.
    let identities: Identities
    /// Handle → the views the entity is a member of (an entry per handle, live or free).
    var memberOf = Memberships()
    /// Which changed entity ``Engine/updateQueries(_:)`` is visiting (``QueryView/visitStamp``).
    var stamp: UInt64 = 0
    /// Handles of types whose last view went, given back in slices between
    /// turns (a type of a million entities must not hold one turn);
    /// `releasingHead` is the next.
    var releasing: [UInt32] = []
    var releasingHead = 0
    /// Member slots all views hold together (members × sort keys, see
    /// ``QueryView/weight``), kept as views are built, dropped and changed
    /// (`--max-query-entities`).
    var heldMembers = 0
    /// Dropped views still filed in the indexes, unfiled in slices between
    /// turns (``Engine/doDeferredWork(units:)``); `retiringHead` is the next.
    /// A view is let go here (nil) once it is unfiled, so it is freed in
    /// its own slice: freeing 40,000 views at once held a turn ~25 ms.
    var retiring: [QueryView?] = []
    var retiringHead = 0
    /// The next view's serial number.
    var nextSerial: UInt32 = 0
    /// Entries of every ``RangeEntityIndex``: an index is built only while
    /// they stay within `--max-query-entities` (else the view is built by
    /// testing every entity of its type, as without the index).
    var rangeIndexEntries = 0

    init(identities: Identities) {
        self.identities = identities
    }
}

extension Engine {
    static func pathKey(_ p: QueryPath) -> String { p.joined(separator: "\u{0}") }

    /// Whether `id`'s type (``Tree/type(of:)``, the part before its first
    /// `:`) is `type`, without making the type's name.
    static func isOfType(_ id: String, _ type: String) -> Bool {
        // An identity without a colon is of type "" too.
        if type.isEmpty { return Tree.type(of: id).isEmpty }
        let r = id.utf8.withContiguousStorageIfAvailable { a in
            type.utf8.withContiguousStorageIfAvailable { b -> Bool in
                guard a.count > b.count, a[b.count] == UInt8(ascii: ":") else { return false }
                for i in 0..<b.count where a[i] != b[i] || a[i] == UInt8(ascii: ":") { return false }
                return true
            }
        }
        if let r, let r { return r }
        return Tree.type(of: id) == type
    }

    /// The window for a definition: shared when it exists, else made over
    /// the view of its definition without a window (shared by every page of
    /// one list), which is built when there is none.
    func queryWindow(_ p: PreparedQuery) throws(ProtocolError) -> QueryWindow {
        let key = p.key
        if let w = queries.windows[key] { return w }
        try checkRoomForADefinition()
        let view = try queryView(p)
        let w = QueryWindow(key: key, spec: p.spec, view: view)
        // What the window shows follows from the view: unchanged since the view last was.
        w.changedAt = view.changedAt
        view.attach(w)
        queries.windows[key] = w
        return w
    }

    /// `--max-query-views`: how many definitions (pages included) are kept.
    private func checkRoomForADefinition() throws(ProtocolError) {
        guard queries.windows.count >= configuration.maxQueryViews else { return }
            throw ProtocolError(.limitExceeded, "the server already keeps \(configuration.maxQueryViews) live query definitions (--max-query-views); share a definition or drop one")
    }

    /// The view for a definition without its window: shared when it exists,
    /// else built from the entities of its type in memory.
    private func queryView(_ p: PreparedQuery) throws(ProtocolError) -> QueryView {
        let key = p.unwindowedKey
        if let v = queries.views[key] { return v }
        let spec = QueryView.unwindowed(p.spec)
        let view = QueryView(key: key, spec: spec, condition: p.condition, large: p.isLarge,
                             identities: queries.identities, visitAllUpTo: configuration.internalChecks ? 0 : 8)
        queries.memberOf.register(view)
        let names = queries.identities
        view.builtAt = seq
        let tq = typeQueries(spec.type)
        view.index = QueryIndexKey.of(view.condition)
        // Build: candidates from the value index when the view has one.
        if let idx = view.index {
            let pk = Self.pathKey(idx.path)
            ensureValueIndex(tq, idx.path)
            if let byValue = tq.entitiesByValue[pk] {
                for vk in idx.values {
                    guard let handles = byValue[vk] else { continue }
                    for h in handles { addMember(h, names.name(h), view) }
                }
            }
            view.valueSlots.reserveCapacity(idx.values.count)
            for (j, vk) in idx.values.enumerated() {
                let filed = TypeQueries.Filed(view: view, value: Int32(j))
                if tq.byValue[pk] == nil { tq.byValue[pk] = [:] }
                if tq.byValue[pk]![vk] == nil {
                    tq.byValue[pk]![vk] = [filed]
                    view.valueSlots.append(0)
                } else {
                    tq.byValue[pk]![vk]!.append(filed)
                    view.valueSlots.append(Int32(tq.byValue[pk]![vk]!.count - 1))
                }
            }
            tq.paths[pk] = (idx.path, (tq.paths[pk]?.views ?? 0) + 1)
        } else {
            let bounds = RangeBounds.of(view.condition)
            if let r = bounds, let index = rangeEntityIndex(tq, r.path) {
                for h in index.ids(from: r.lo, through: r.hi) { addMember(h, names.name(h), view) }
            } else {
                for h in tq.entities { addMember(h, names.name(h), view) }
            }
            queries.nextSerial &+= 1
            view.serial = queries.nextSerial
            if let r = bounds {
                view.range = r
                let pk = Self.pathKey(r.path)
                if tq.ranges[pk] == nil { tq.ranges[pk] = (r.path, RangeTree()) }
                tq.ranges[pk]!.tree.insert(view, serial: view.serial, lo: r.lo, hi: r.hi)
            } else {
                view.unindexedSlot = Int32(tq.unindexed.count)
                tq.unindexed.append(view)
            }
        }
        view.tree.shrinkToFit()
        tq.viewCount += 1
        queries.views[key] = view
        // Memory is bounded by configuration: every view holds all its matches.
        queries.heldMembers += view.held
        if queries.heldMembers > configuration.maxQueryEntities {
            let n = view.count
            dropQueryView(view)
            throw ProtocolError(.limitExceeded, "this query matches \(n) entities (× \(view.weight) sort keys); with the live queries already kept that is over \(configuration.maxQueryEntities) (--max-query-entities): narrow it with a condition")
        }
        return view
    }

    private func typeQueries(_ type: String) -> TypeQueries {
        if let t = queries.types[type] { return t }
        // The handles of a dropped type must be unlisted before its
        // entities are listed again (this is a scan of the store anyway).
        _ = releaseHandles(units: .max)
        let t = TypeQueries()
        let ids = queries.identities
        for h in 0..<UInt32(ids.capacity) where ids.record(h) != nil && Self.isOfType(ids.name(h), type) {
            listEntity(h, t)
        }
        queries.types[type] = t
        return t
    }

    /// Lists an entity of a queried type that is not listed (its handle is
    /// the store's: it is in memory).
    private func listEntity(_ h: UInt32, _ tq: TypeQueries) {
        let ids = queries.identities
        // Grown by half, as the identities' columns are.
        queries.memberOf.grow(to: ids.capacity, reserve: ids.reservedCapacity)
        ids.list(h, slot: Int32(tq.entities.count))
        if tq.entities.count == tq.entities.capacity { tq.entities.reserveCapacity(Identities.grownByHalf(tq.entities.count)) }
        tq.entities.append(h)
    }

    /// Takes an entity out of its type's list (it is gone): its handle is
    /// unlisted (and freed, the store no longer holding it), and its
    /// memberships (of dropped views, if any are left) go with it.
    private func unlistEntity(_ h: UInt32, _ tq: TypeQueries) {
        let ids = queries.identities
        let slot = Int(ids.typeSlot[Int(h)])
        let last = tq.entities.removeLast()
        if slot < tq.entities.count {
            tq.entities[slot] = last
            ids.move(last, toSlot: Int32(slot))
        }
        unlistHandle(h)
    }

    /// Unlists a handle with its memberships; when none is listed, the
    /// membership column goes.
    private func unlistHandle(_ h: UInt32) {
        queries.memberOf.clear(h)
        queries.identities.unlist(h)
        if queries.identities.listed == 0 { queries.memberOf.removeAllLists() }
    }

    /// Unlists the handles of a type whose last view went, in slices
    /// (``releaseHandles(units:)``): a type of a million entities must not
    /// hold one turn.
    private func unlistEntities(_ tq: TypeQueries) {
        queries.releasing.append(contentsOf: tq.entities)
        tq.entities = []
    }

    /// Gives back at most `units` handles of dropped types; returns the units used.
    func releaseHandles(units: Int) -> Int {
        var used = 0
        while used < units, queries.releasingHead < queries.releasing.count {
            let h = queries.releasing[queries.releasingHead]
            queries.releasingHead += 1
            unlistHandle(h)
            used += 1
        }
        if queries.releasingHead == queries.releasing.count {
            queries.releasing = []
            queries.releasingHead = 0
        }
        return used
    }

    /// Files entity `h` in a view being built, when its value matches.
    private func addMember(_ h: UInt32, _ id: String, _ view: QueryView) {
        guard let v = store.entity(id), let node = view.add(h, v) else { return }
        view.setSlot(node, queries.memberOf.append(h, Membership(view: view, node: node)))
    }

    /// The type's entities ordered by `path`, built on first use (one pass
    /// over the type) unless that would pass the entries' budget.
    private func rangeEntityIndex(_ tq: TypeQueries, _ path: QueryPath) -> RangeEntityIndex? {
        let pk = Self.pathKey(path)
        if let index = tq.entitiesByRange[pk] { return index }
        guard queries.rangeIndexEntries + tq.entities.count <= configuration.maxQueryEntities else { return nil }
        let index = RangeEntityIndex(path: path, identities: queries.identities)
        for h in tq.entities {
            if let k = index.key(store.entity(queries.identities.name(h))) { index.insert(h, k) }
        }
        queries.rangeIndexEntries += index.count
        tq.entitiesByRange[pk] = index
        return index
    }

    private func ensureValueIndex(_ tq: TypeQueries, _ path: QueryPath) {
        let pk = Self.pathKey(path)
        guard tq.entitiesByValue[pk] == nil else { return }
        var byValue: [String: Set<UInt32>] = [:]
        for h in tq.entities {
            guard let v = store.entity(queries.identities.name(h)), let x = QueryEval.value(v, path) else { continue }
            let k = QueryEval.filingKey(x)
            byValue[k, default: []].insert(h)
        }
        tq.entitiesByValue[pk] = byValue
    }

    /// Takes `view` out of entity `h`'s list, in O(1): the last membership
    /// of the list moves into its slot. Nothing when the list no longer
    /// holds it there (an update rebuilt the list without the dropped view,
    /// or the entity went and its handle was given again: lists are only
    /// ever built with live views).
    private func unfileMember(_ h: UInt32, _ view: QueryView, slot: Int32) {
        guard slot >= 0, Int(h) < queries.memberOf.handles, Int(slot) < queries.memberOf.count(of: h),
              queries.memberOf[h, Int(slot)].view === view else { return }
        if let moved = queries.memberOf.remove(h, at: Int(slot)) { moved.view.setSlot(moved.node, slot) }
    }

    /// A window lost its last subscriber: it goes, and its view with it when
    /// it was the view's last window.
    func dropQueryWindow(_ w: QueryWindow) {
        queries.windows[w.key] = nil
        w.pending = []
        w.view.detach(w)
        if w.view.windows.isEmpty { dropQueryView(w.view) }
    }

    /// A view lost its last window (or could not be kept): it is no
    /// longer found by its definition, its memory and count are released at
    /// once, and it is unfiled from the indexes in slices between turns
    /// (deferred work), so dropping many large views never holds a turn.
    func dropQueryView(_ view: QueryView) {
        queries.views[view.key] = nil
        queries.heldMembers -= view.held
        view.retired = true
        for w in view.windows where queries.windows[w.key] === w { queries.windows[w.key] = nil }
        view.dropWindows()
        // Its tree is kept until its memberships are unfiled (they are found through it).
        view.unfileCursor = 0
        queries.retiring.append(view)
    }

    /// An unfiled view is freed with its slice; a large definition's list
    /// and sets (a 100,000-value `in`) are kept to be freed elsewhere
    /// (``Engine/garbage``): their last references go with these copies.
    private func letGo(_ view: QueryView) {
        guard collectsGarbage, view.large else { return }
        garbage.append(view.spec)
        if let c = view.condition { garbage.append(c) }
    }

    /// Unfiles retired views: at most `units` memberships and index entries.
    /// Returns the units used.
    func unfileRetiredViews(units: Int) -> Int {
        var used = 0
        while used < units, queries.retiringHead < queries.retiring.count {
            guard let view = queries.retiring[queries.retiringHead] else {
                queries.retiringHead += 1
                continue
            }
            // Its memberships: every node of its tree.
            while used < units, view.unfileCursor < view.tree.nodeCapacity {
                let n = view.unfileCursor
                view.unfileCursor += 1
                let h = view.tree.id(ofNode: n)
                if h != Identities.none { unfileMember(h, view, slot: view.tree.element(Int32(n)).values.slot) }
                used += 1
            }
            if used >= units { break }
            view.tree.removeAll()
            view.unfileCursor = 0
            guard let tq = queries.types[view.spec.type] else {
                letGo(view)
                queries.memberOf.unregister(view)
                queries.retiring[queries.retiringHead] = nil
                queries.retiringHead += 1
                used += 8
                continue
            }
            // Its entries in the value index.
            if let idx = view.index {
                let pk = Self.pathKey(idx.path)
                while used < units, view.unfiledValues < idx.values.count {
                    let j = view.unfiledValues
                    unfileValue(tq, pk, idx.values[j], view, slot: view.valueSlots[j])
                    view.unfiledValues += 1
                    used += 1
                }
                if used >= units { break }
                let left = (tq.paths[pk]?.views ?? 1) - 1
                if left == 0 {
                    tq.paths[pk] = nil
                    tq.byValue[pk] = nil
                    tq.entitiesByValue[pk] = nil
                } else {
                    tq.paths[pk]?.views = left
                }
            } else if let r = view.range {
                let pk = Self.pathKey(r.path)
                tq.ranges[pk]?.tree.remove(lo: r.lo, serial: view.serial)
                if tq.ranges[pk]?.tree.count == 0 {
                    tq.ranges[pk] = nil
                    if let index = tq.entitiesByRange.removeValue(forKey: pk) { queries.rangeIndexEntries -= index.count }
                }
                view.range = nil
                used += 1
            } else if view.unindexedSlot >= 0, Int(view.unindexedSlot) < tq.unindexed.count, tq.unindexed[Int(view.unindexedSlot)] === view {
                let i = Int(view.unindexedSlot)
                let last = tq.unindexed.removeLast()
                if i < tq.unindexed.count {
                    tq.unindexed[i] = last
                    last.unindexedSlot = Int32(i)
                }
                view.unindexedSlot = -1
                used += 1
            }
            tq.viewCount -= 1
            if tq.viewCount == 0 {
                for index in tq.entitiesByRange.values { queries.rangeIndexEntries -= index.count }
                tq.entitiesByRange = [:]
                tq.entitiesByValue = [:]
                unlistEntities(tq)
                queries.types[view.spec.type] = nil
                // Its entities may be evicted again; a later query lists them anew.
                persistence?.loadedTypes.remove(view.spec.type)
            }
            // Unfiled: let go (freed now, with this slice).
            letGo(view)
            queries.memberOf.unregister(view)
            queries.retiring[queries.retiringHead] = nil
            queries.retiringHead += 1
            used += 8
        }
        if queries.retiringHead == queries.retiring.count {
            queries.retiring = []
            queries.retiringHead = 0
        } else if queries.retiringHead > 1024 && queries.retiringHead * 2 > queries.retiring.count {
            queries.retiring.removeFirst(queries.retiringHead)
            queries.retiringHead = 0
        }
        return used
    }

    /// Removes one filing of a view under value key `vk`, in O(1).
    private func unfileValue(_ tq: TypeQueries, _ pk: String, _ vk: String, _ view: QueryView, slot: Int32) {
        guard var count = tq.byValue[pk]?[vk]?.count, slot >= 0, Int(slot) < count,
              tq.byValue[pk]![vk]![Int(slot)].view === view else { return }
        let last = tq.byValue[pk]![vk]!.removeLast()
        count -= 1
        if Int(slot) < count {
            tq.byValue[pk]![vk]![Int(slot)] = last
            last.view.valueSlots[Int(last.value)] = slot
        } else if count == 0 {
            tq.byValue[pk]![vk] = nil
        }
    }

    /// Whether dropped views are still being unfiled.
    var hasRetiringViews: Bool {
        queries.retiringHead < queries.retiring.count || queries.releasingHead < queries.releasing.count
    }

    /// The current window's values.
    func queryItems(_ w: QueryWindow) -> [JSON] {
        w.windowIDs().map { store.entity($0) ?? .null }
    }

    /// `get` with a query: answered from a shared view when one exists (any
    /// page of the same list), else from a view built for this read and
    /// dropped at once.
    func readQuery(_ p: PreparedQuery) throws(ProtocolError) -> (items: [JSON], count: Int) {
        if let w = queries.windows[p.key] { return (queryItems(w), w.count) }
        let existing = queries.views[p.unwindowedKey]
        if existing == nil { try checkRoomForADefinition() }
        let view: QueryView
        if let existing { view = existing } else { view = try queryView(p) }
        let w = QueryWindow(key: p.key, spec: p.spec, view: view)
        let result = (queryItems(w), w.count)
        if existing == nil { dropQueryView(view) }
        return result
    }

    // MARK: Maintenance

    /// Hands every changed entity of a queried type to the views it can
    /// affect, in a fixed order; returns the views that changed, ordered by
    /// definition, with their changes.
    func updateQueries(_ change: StoreChange) -> [(QueryWindow, [CollectionStep])] {
        guard !queries.types.isEmpty else { return [] }
        var changed: [(id: String, tq: TypeQueries)] = []
        // The changed entities of one mutation are mostly of one or two
        // types (an author's hundred posts): the last type's answer is kept
        // and its name compared with the identity's prefix, instead of
        // making the type's name and hashing it for every entity.
        var lastType: String?
        var lastQueries: TypeQueries?
        func queriesOf(_ id: String) -> TypeQueries? {
            if let t = lastType, Self.isOfType(id, t) { return lastQueries }
            let t = Tree.type(of: id)
            lastType = t
            lastQueries = queries.types[t]
            return lastQueries
        }
        for id in change.valueChanged {
            if let tq = queriesOf(id) { changed.append((id, tq)) }
        }
        let hashed = change.valueChanged.hashed(forLookups: change.deleted.count)
        for id in change.deleted where !(hashed?.contains(id) ?? change.valueChanged.contains(id)) {
            if let tq = queriesOf(id) { changed.append((id, tq)) }
        }
        guard !changed.isEmpty else { return [] }
        // A fixed order (Set order is not): the same input gives the same events.
        if changed.count > 1 { changed.sort { $0.id < $1.id } }
        var touched: [QueryView] = []
        let current: (String) -> JSON? = { self.store.entity($0) }
        var candidates: [Membership] = []
        let ids = queries.identities
        // Per indexed path of the type (in `tq.paths`' order), the last new
        // value seen and its filing key: an author's hundred posts hold one
        // author, so its key is made once, not per post. Equal values (JSON
        // `==`) file under one key, so the key of an equal value is reused.
        var keyCacheOwner: ObjectIdentifier?
        // With it, the views filed under that key (`byValue` does not
        // change while the views take the entities).
        var keyCache: [(x: JSON, key: String, filed: [TypeQueries.Filed]??)?] = []
        // This entity's new filing key per indexed path, for the candidates.
        var newKeys: [(pk: String, key: String?, slot: Int)] = []
        var beforeReader = Store.BeforeReader(store)
        for (id, tq) in changed {
            // Its handle is the store's, or the listing's when the store
            // no longer holds it (deleted): one lookup for both.
            let known = ids.find(id)
            let rec = known.flatMap { ids.record($0) }
            let value = rec?.value
            // Its value from before: read through the reader, not built,
            // for a record refreshed in place (an author's renamed posts).
            let inPlace = rec.map(beforeReader.refreshedInPlace) ?? false
            var builtBefore: JSON? = inPlace ? nil : store.valueBeforeMutation(id)
            func before() -> JSON {
                if let b = builtBefore { return b }
                let b = store.valueBeforeMutation(id)
                builtBefore = b
                return b
            }
            // Written back to what it was (within a batch): nothing to do.
            let unchanged = inPlace ? beforeReader.isUnchanged(rec!) : builtBefore! == (value ?? .null)
            if inPlace && configuration.internalChecks {
                // The reader against the value it stands for.
                precondition(unchanged == (before() == (value ?? .null)), "internal check: the reader's unchanged for '\(id)' is not the value from before's")
                for (_, entry) in tq.paths {
                    precondition(beforeReader.value(of: rec!, at: entry.path) == QueryEval.value(before(), entry.path),
                                 "internal check: the reader's value at a path of '\(id)' is not the value from before's")
                }
            }
            if unchanged { continue }
            // The type's entity list (its handle) and value indexes.
            guard let h = known else { continue }  // deleted, and not listed: the internal checks say so
            if !ids.isListed(h) {
                // Created by this mutation (else: not listed although it
                // was in memory, which the internal checks report). A
                // record refreshed in place had a value before.
                guard !inPlace, builtBefore! == .null else { continue }
                listEntity(h, tq)
            }
            if keyCacheOwner != ObjectIdentifier(tq) {
                keyCacheOwner = ObjectIdentifier(tq)
                keyCache.drain()
                for _ in 0 ..< tq.paths.count { keyCache.append(nil) }
            }
            newKeys.drain()
            var p = 0
            for (pk, entry) in tq.paths {
                let newX = value.flatMap { QueryEval.value($0, entry.path) }
                var newKey: String?
                if let newX {
                    if let c = keyCache[p], c.x == newX {
                        newKey = c.key
                    } else {
                        let k = QueryEval.filingKey(newX)
                        keyCache[p] = (newX, k, nil)
                        newKey = k
                    }
                }
                newKeys.append((pk, newKey, p))
                p += 1
                // The same value at the path (an author renamed: its posts'
                // `author.id` stays): filed where it was.
                let oldX = inPlace ? beforeReader.value(of: rec!, at: entry.path)
                    : (builtBefore! == .null ? nil : QueryEval.value(builtBefore!, entry.path))
                if oldX == newX { continue }
                let oldKey = oldX.map(QueryEval.filingKey)
                if oldKey != newKey {
                    if let oldKey { tq.entitiesByValue[pk]?[oldKey]?.remove(h) }
                    if let newKey { tq.entitiesByValue[pk]?[newKey, default: []].insert(h) }
                }
            }
            if !tq.entitiesByRange.isEmpty {
                let b = before()
                for index in tq.entitiesByRange.values {
                    queries.rangeIndexEntries += index.move(h, from: b == .null ? nil : b, to: value)
                }
            }
            // Candidates: where it is (with its nodes), where its new value
            // may put it, and the unindexed; each view once (its stamp).
            // Dropped views are skipped (they are being unfiled).
            queries.stamp &+= 1
            let stamp = queries.stamp
            candidates.drain()
            queries.memberOf.forEach(h) { m in
                guard !m.view.retired else { return }
                m.view.visitStamp = stamp
                candidates.append(m)
            }
            func consider(_ view: QueryView) {
                guard !view.retired, view.visitStamp != stamp else { return }
                view.visitStamp = stamp
                candidates.append(Membership(view: view, node: -1))
            }
            if value != nil {
                for (pk, key, slot) in newKeys {
                    guard let key else { continue }
                    let filed: [TypeQueries.Filed]?
                    if let known = keyCache[slot]!.filed {
                        filed = known
                    } else {
                        filed = tq.byValue[pk]?[key]
                        keyCache[slot]!.filed = .some(filed)
                    }
                    guard let filed else { continue }
                    for f in filed { consider(f.view) }
                }
            }
            if let value, !tq.ranges.isEmpty {
                for (_, entry) in tq.ranges {
                    guard let x = QueryEval.value(value, entry.path), let k = RangeKey(x) else { continue }
                    entry.tree.forEach(holding: k) { consider($0) }
                }
            }
            for view in tq.unindexed { consider(view) }
            // Every view it was in is a candidate: its list is rebuilt from
            // the results (its overflow list kept for the rebuild).
            queries.memberOf.empty(h)
            for c in candidates {
                let view = c.view
                let listed = view.touched
                let node = view.apply(h, node: c.node, value: value, current: current)
                if node >= 0 { view.setSlot(node, queries.memberOf.append(h, Membership(view: view, node: node))) }
                if !listed && view.touched { touched.append(view) }
            }
            queries.memberOf.trim(h)
            if value == nil { unlistEntity(h, tq) }
        }
        var out: [(QueryWindow, [CollectionStep])] = []
        for view in touched {
            queries.heldMembers += (view.count - view.countBefore) * view.weight
            view.changedAt = seq
            for w in view.windows {
                if let changes = w.takeChanges(current: current) {
                    w.changedAt = seq
                    out.append((w, changes))
                }
            }
            view.touched = false
        }
        // Ordered by definition: the same input gives the same events.
        if out.count > 1 { out.sort { $0.0.key < $1.0.key } }
        return out
    }

    /// After a mutation grew the views past `--max-query-entities`: the
    /// mutation stands (a writer is never refused because of someone else's
    /// query), and the views holding the most end, largest first, until the
    /// rest fit. Each of their subscriptions gets a view-ending `delete`
    /// event with an `error` (`limit_exceeded`), as `clear` ends views.
    func enforceQueryCap(seq: Int) {
        guard queries.heldMembers > configuration.maxQueryEntities else { return }
        var views = Array(queries.views.values)
        views.sort { $0.held != $1.held ? $0.held > $1.held : $0.key < $1.key }
        for view in views {
            guard queries.heldMembers > configuration.maxQueryEntities else { break }
            let message = "this live query grew to \(view.count) entities (× \(view.weight) sort keys) and the live queries together passed --max-query-entities (\(configuration.maxQueryEntities)); it ended: narrow it with a condition"
            // Every page of the list ends: they share its matches.
            var subs: [SubscriptionRecord] = []
            for w in view.windows { w.forEach { subs.append($0) } }
            for s in Self.ordered(subs) {
                s.client.output.append(limitEndEventBytes(s, seq: seq, message: message))
                markDirty(s.client)
                forgetEnded(s)
            }
            for w in view.windows { w.removeAll() }
            dropQueryView(view)
        }
    }

    /// `{"event":"delete","sub":S,"seq":n,"error":{"code":"limit_exceeded","message":…}}`
    func limitEndEventBytes(_ s: SubscriptionRecord, seq: Int, message: String) -> [UInt8] {
        var w = JSONWriter(capacity: 256)
        eventHeader(&w, "delete", s, seq)
        w.raw(",\"error\":{\"code\":\"limit_exceeded\",\"message\":")
        w.string(message)
        w.raw("}}\n")
        return w.bytes
    }

    /// Queues one mutation's query events (serial part of rendering).
    func sendQueryEvents(_ list: [(QueryWindow, [CollectionStep])], seq: Int, context: JSON?) {
        for (view, changes) in list {
            var w = JSONWriter(capacity: 128)
            writeQueryBody(&w, changes: changes, count: view.count, context: context)
            let payload = OutputBytes.copy(w.bytes)
            // `origin` does not suppress query events (§3.1): no origins here.
            send(payload, to: view, event: "query", seq: seq, changed: true, origins: [], context: context)
        }
    }

    /// `,"changes":[…],"count":n[,"context":…]}\n`
    func writeQueryBody(_ w: inout JSONWriter, changes: [CollectionStep], count: Int, context: JSON?) {
        w.raw(",\"changes\":")
        writeChanges(&w, changes)
        w.raw(",\"count\":")
        w.int(count)
        writeContextAndEnd(&w, context)
    }

    /// Every query view ends (clear): their subscriptions are ended by the caller.
    func clearQueries() {
        persistence?.loadedTypes = []
        for w in queries.windows.values { w.removeAll(); w.pending = [] }
        for v in queries.views.values { v.dropAll() }
        queries.views = [:]
        queries.windows = [:]
        queries.types = [:]
        queries.memberOf.removeAll()
        queries.identities.unlistAll()
        queries.heldMembers = 0
        queries.rangeIndexEntries = 0
        queries.retiring = []
        queries.retiringHead = 0
        queries.releasing = []
        queries.releasingHead = 0
    }
}
