import ConcordJSON
import ConcordProtocol

/// The matches of one query definition **without its window**: every
/// matching entity of the type, ordered, in an ``OrderTree``. Definitions
/// that differ only in `offset`/`limit` (pages of one list) share it; each
/// of them is a ``QueryWindow`` over it, positions `offset ..< offset + limit`.
///
/// A mutation hands the view each changed entity of its type in turn
/// (``apply(_:value:current:)``): the view moves it in the tree once, in
/// O(log n), and each window writes the changes that take its previous
/// window to the new one — at most one `remove` and one `insert` for an
/// entity that moves, plus the refill of a window that lost an item.
/// Changes of one mutation accumulate in each window's `pending` and become
/// one event per window.
final class QueryView {
    /// The canonical key of the definition without its window.
    let key: String
    let spec: QuerySpec
    /// The members, by handle (``Identities``): each node holds the
    /// member's sort values and its place in the engine's `memberOf` list of
    /// the entity (so leaving it is O(1)). Which node holds an entity is
    /// kept in that list, not here: an update reaches a view through it.
    var tree: OrderTree<Placed>
    struct Placed {
        var sort: SortKey
        var slot: Int32
    }
    let identities: Identities
    /// The condition, prepared (hash sets for `in` lists).
    let condition: CompiledCondition?
    /// The path of a one-key order, kept apart: reading it from `spec` per
    /// changed entity copied the order's list and the path (~250 instructions).
    private let soleOrderPath: QueryPath?
    /// Its definition holds many values (``PreparedQuery/isLarge``).
    let large: Bool
    /// The windows over it (at least one while it is live), in no order;
    /// each knows its slot, so one leaves in O(1) (a connection closing with
    /// thousands of pages of one list must not cost their square).
    var windows: [QueryWindow] = []
    /// The windows with a limit, ordered by offset, and those without one:
    /// an entity that changes in place or moves reaches only the windows
    /// around its ranks, so those are all a change visits (O(log w + k)),
    /// not every page of the list. `maxLimit` is the largest limit a window
    /// had (it only grows: a bound, never too small).
    struct WindowAt {
        var offset: Int
        unowned(unsafe) var window: QueryWindow?  // a window is taken out before it goes
    }
    var byOffset = OrderTree<WindowAt>(vacant: WindowAt(offset: 0, window: nil)) { a, b in
        a.values.offset != b.values.offset ? a.values.offset < b.values.offset : a.id < b.id
    }
    /// Numbers for its windows (their tie-break in `byOffset`).
    private var nextWindowSerial: UInt32 = 0
    var unlimited: [QueryWindow] = []
    var maxLimit = 0
    /// Up to this many windows a change simply visits them all (cheaper than
    /// the lookup); 0 under the internal checks, so that tests go through
    /// the lookup whatever their size.
    let visitAllUpTo: Int
    /// Whether the mutation being rendered concerned it, and the count before it.
    var countBefore = 0
    var touched = false
    /// How this view is found by an update (Engine+Queries: the equality index).
    var index: QueryIndexKey?
    /// With `index`: this view's place in the index list of each of its values.
    var valueSlots: [Int32] = []
    /// Without `index`: the range of one path it is filed under in its
    /// type's range index (Engine+Queries), or nil when it is unindexed.
    var range: RangeBounds?
    /// A number no other view of this engine has (the range index's tie-break).
    var serial: UInt32 = 0
    /// Neither `index` nor `range`: its place in its type's `unindexed` list.
    var unindexedSlot: Int32 = -1
    /// Dropped: no longer found by definition, skipped by updates, and being
    /// unfiled from the indexes in slices (Engine+Queries, deferred work).
    var retired = false
    /// Its number in the engine's membership lists (``Memberships/register(_:)``), −1 when it has none.
    var membershipNumber: Int32 = -1
    /// The seq when it was built, and of the last mutation that concerned
    /// one of its members (`since`, §3.2: a window's contents follow from these).
    var builtAt = 0
    var changedAt = 0
    /// Retired views: the next node of the tree to unfile, and how far the value index is.
    var unfileCursor = 0
    var unfiledValues = 0
    /// Which changed entity last reached it (``Engine/updateQueries(_:)``: a view is visited once per entity).
    var visitStamp: UInt64 = 0

    /// `spec` without its window (offset 0, no limit).
    init(key: String, spec: QuerySpec, condition: CompiledCondition?, large: Bool = false, identities: Identities, visitAllUpTo: Int = 8) {
        self.key = key
        self.spec = spec
        self.identities = identities
        self.visitAllUpTo = visitAllUpTo
        self.condition = condition
        self.large = large
        let order = spec.order
        soleOrderPath = order.count == 1 ? order[0].path : nil
        tree = OrderTree(vacant: Placed(sort: SortKey(), slot: -1)) { [unowned identities] a, b in
            for i in order.indices {
                var c = SortValue.compare(a.values.sort[i], b.values.sort[i])
                if order[i].descending { c = -c }
                if c != 0 { return c < 0 }
            }
            return QueryEval.compareStrings(identities.name(a.id), identities.name(b.id)) < 0
        }
    }

    /// The definition without its window, and its key.
    static func unwindowed(_ spec: QuerySpec) -> QuerySpec {
        var s = spec
        s.offset = 0
        s.limit = nil
        return s
    }

    var count: Int { tree.count }

    /// What one member costs against `--max-query-entities`: a member keeps
    /// one sort value per order key, so it counts once per key (at least once).
    var weight: Int { max(1, spec.order.count) }

    /// This view's share of `--max-query-entities` (once, however many windows).
    var held: Int { tree.count * weight }

    func matches(_ value: JSON) -> Bool {
        condition?.matches(value) ?? true
    }

    func sortValues(_ value: JSON) -> SortKey {
        if let path = soleOrderPath {
            var k = SortKey()
            k.packed = SortValue(QueryEval.value(value, path))
            return k
        }
        if spec.order.isEmpty { return SortKey() }
        return SortKey(spec.order.map { SortValue(QueryEval.value(value, $0.path)) })
    }

    /// Files an entity without producing changes (building the view):
    /// its node, nil when it does not match.
    func add(_ id: UInt32, _ value: JSON) -> Int32? {
        guard matches(value) else { return nil }
        return tree.insertNode(.init(values: Placed(sort: sortValues(value), slot: -1), id: id)).node
    }

    /// Records where a member is in the engine's list of its views.
    @inline(__always)
    func setSlot(_ node: Int32, _ slot: Int32) { tree.modifyValues(node) { $0.slot = slot } }

    /// Empties it (the view is being dropped).
    func dropAll() {
        tree.removeAll()
        dropWindows()
    }

    /// Lets go of every window (the view is being dropped).
    func dropWindows() {
        for w in windows {
            w.pending = []
            w.windowSlot = -1
            w.offsetNode = -1
        }
        windows = []
        byOffset.removeAll()
        unlimited = []
    }

    func attach(_ w: QueryWindow) {
        w.windowSlot = Int32(windows.count)
        windows.append(w)
        if let limit = w.limit {
            nextWindowSerial &+= 1
            w.offsetNode = byOffset.insertNode(.init(values: WindowAt(offset: w.offset, window: w), id: nextWindowSerial)).node
            maxLimit = max(maxLimit, limit)
        } else {
            w.offsetNode = Int32(unlimited.count)
            unlimited.append(w)
        }
    }

    /// Takes a window out in O(1): the last one moves into its slot.
    func detach(_ w: QueryWindow) {
        guard Self.swapRemove(w, at: w.windowSlot, from: &windows, moved: { $0.windowSlot = $1 }) else { return }
        w.windowSlot = -1
        if w.limit != nil {
            byOffset.remove(node: w.offsetNode)
        } else {
            _ = Self.swapRemove(w, at: w.offsetNode, from: &unlimited, moved: { $0.offsetNode = $1 })
        }
        w.offsetNode = -1
    }

    /// Takes `w` out of `list`, where it is at `slot`, by moving the last one
    /// into its place (`moved` tells that one its new slot). False when it is
    /// not there.
    private static func swapRemove(_ w: QueryWindow, at slot: Int32, from list: inout [QueryWindow],
                                   moved: (QueryWindow, Int32) -> Void) -> Bool {
        let i = Int(slot)
        guard i >= 0, i < list.count, list[i] === w else { return false }
        let last = list.removeLast()
        if i < list.count {
            list[i] = last
            moved(last, slot)
        }
        return true
    }

    /// The windows a change between ranks `lo` and `hi` can reach: every
    /// window without a limit that starts at or before `hi`, and the limited
    /// ones that start at or before `hi` and may end after `lo`.
    private func forEachWindow(reaching lo: Int, _ hi: Int, _ body: (QueryWindow) -> Void) {
        if windows.count <= visitAllUpTo {
            for w in windows { body(w) }
            return
        }
        for w in unlimited where w.offset <= hi { body(w) }
        var i = byOffset.prefixCount { $0.values.offset <= hi } - 1
        while i >= 0 {
            let e = byOffset.select(i)
            if e.values.offset + maxLimit <= lo { break }
            body(e.values.window!)
            i -= 1
        }
    }

    private func sameValues(_ a: SortKey, _ b: SortKey) -> Bool {
        for i in spec.order.indices where SortValue.compare(a[i], b[i]) != 0 { return false }
        return true
    }

    /// What one entity's change did to the ordered matches (ranks before
    /// and after; `n` is the count before).
    enum Move {
        case stayed(rank: Int)
        case moved(from: Int, to: Int)
        case entered(at: Int)
        case left(from: Int)
    }

    /// Re-files one entity after a change (`value` nil: it is gone) and
    /// appends each window's changes. `node` is the entity's node when it
    /// is a member (-1 when not). `current` reads an entity's current
    /// value. Returns its node afterwards, -1 when it is not a member.
    func apply(_ id: UInt32, node: Int32, value: JSON?, current: (String) -> JSON?) -> Int32 {
        let old = node >= 0 ? tree.element(node).values.sort : nil
        let isMember = value.map(matches) ?? false
        guard old != nil || isMember else { return -1 }
        // Touched only when the entity concerns it (an unindexed view tested
        // and not matched costs nothing more).
        if !touched {
            touched = true
            countBefore = tree.count
        }
        let n = tree.count
        let move: Move
        var result: Int32 = -1
        switch (old, isMember) {
        case (let ov?, true):
            let nv = sortValues(value!)
            if sameValues(ov, nv) {
                move = .stayed(rank: tree.rank(node: node))
                result = node
            } else {
                let rOld = tree.remove(node: node)
                let (rNew, newNode) = tree.insertNode(.init(values: Placed(sort: nv, slot: -1), id: id))
                result = newNode
                move = .moved(from: rOld, to: rNew)
            }
        case (nil, true):
            let (rNew, newNode) = tree.insertNode(.init(values: Placed(sort: sortValues(value!), slot: -1), id: id))
            result = newNode
            move = .entered(at: rNew)
        case (.some, false):
            let rOld = tree.remove(node: node)
            move = .left(from: rOld)
        case (nil, false):
            return -1
        }
        switch move {
        case .stayed(let r):
            forEachWindow(reaching: r, r) { $0.note(move, n: n, value: value, current: current) }
        case .moved(let a, let b):
            forEachWindow(reaching: min(a, b), max(a, b)) { $0.note(move, n: n, value: value, current: current) }
        case .entered, .left:
            // Every window after the rank shifts, and every one's count changes.
            for w in windows { w.note(move, n: n, value: value, current: current) }
        }
        return result
    }
}

/// One definition of a query, window included: what its subscribers see
/// (PROTOCOL.md §3.1), positions `offset ..< offset + limit` of its
/// ``QueryView``'s ordered matches.
final class QueryWindow: SharedView {
    /// The definition's canonical key (window included).
    let key: String
    let offset: Int
    let limit: Int?
    let view: QueryView
    /// Window changes of the mutation being rendered.
    var pending: [CollectionStep] = []
    /// The seq of the last mutation that changed its window or count (`since`, §3.2).
    var changedAt = 0
    /// Its place in its view's `windows`, and its node in `byOffset` (with a
    /// limit) or its place in `unlimited` (without).
    var windowSlot: Int32 = -1
    var offsetNode: Int32 = -1

    init(key: String, spec: QuerySpec, view: QueryView) {
        self.key = key
        offset = spec.offset
        limit = spec.limit
        self.view = view
    }

    var count: Int { view.tree.count }

    /// Window size for a list of `total` matches.
    func windowSize(_ total: Int) -> Int {
        let rest = max(0, total - offset)
        if let limit { return min(limit, rest) }
        return rest
    }

    func windowIDs() -> [String] {
        view.tree.ids(offset ..< offset + windowSize(view.tree.count)).map(view.identities.name)
    }

    /// Appends the changes one entity's move makes to this window; `n` is
    /// the count before it, the tree is already the one after it.
    func note(_ move: QueryView.Move, n: Int, value: JSON?, current: (String) -> JSON?) {
        let k = offset
        func item(_ pos: Int) -> JSON { current(view.identities.name(view.tree.select(pos).id)) ?? .null }
        func insert(_ i: Int, _ v: JSON) { pending.append(.insert(index: i, items: [v])) }
        func remove(_ i: Int) { pending.append(.remove(index: i, count: 1)) }
        switch move {
        case .stayed(let r):
            let i = r - k
            if i >= 0 && i < windowSize(n) { pending.append(.update(index: i, item: value!)) }
        case .moved(let rOld, let rNew):
            let v = value!
            let m = windowSize(n)
            let i = rOld - k, j = rNew - k
            let inOld = i >= 0 && i < m, inNew = j >= 0 && j < m
            if rOld == rNew {
                if inOld { pending.append(.update(index: i, item: v)) }
            } else if inOld && inNew {
                remove(i)
                insert(j, v)
            } else if inOld {
                remove(i)
                if j >= m { insert(m - 1, item(k + m - 1)) } else { insert(0, item(k)) }
            } else if inNew {
                if i < 0 {
                    remove(0)
                    insert(j, v)
                } else {
                    insert(j, v)
                    remove(m)
                }
            } else if i < 0 && j >= m && m > 0 {
                remove(0)
                insert(m - 1, item(k + m - 1))
            } else if i >= m && j < 0 && m > 0 {
                insert(0, item(k))
                remove(m)
            }
        case .entered(let rNew):
            let before = windowSize(n), after = windowSize(n + 1)
            let full = limit.map { before == $0 } ?? false
            let j = rNew - k
            if j < 0 {
                if after > 0 {
                    insert(0, item(k))
                    if full { remove(before) }
                }
            } else if j < after {
                insert(j, value!)
                if full { remove(before) }
            }
        case .left(let rOld):
            let before = windowSize(n), after = windowSize(n - 1)
            let i = rOld - k
            if i < before && before > 0 {
                remove(max(i, 0))
                if after == before { insert(after - 1, item(k + after - 1)) }
            }
        }
    }

    /// The changes of the mutation, shortened to one `reset` when that is
    /// smaller (a limited window that changed more than its size); nil when
    /// neither the window nor the count changed.
    func takeChanges(current: (String) -> JSON?) -> [CollectionStep]? {
        defer { pending = [] }
        guard view.touched, !pending.isEmpty || view.tree.count != view.countBefore else { return nil }
        if let limit, pending.count > limit {
            return [.reset(items: windowIDs().map { current($0) ?? .null })]
        }
        return pending
    }
}

/// How a query view is filed for updates: by the value at one path (an
/// equality or `in` condition the query cannot match without), or not at all.
struct QueryIndexKey {
    var path: QueryPath
    var values: [String]

    /// The longest `in` set filed in the equality index.
    static let maxIndexedValues = 1024

    /// The first indexable condition: `eq`, or a set of values (`in`, or
    /// `any` of `eq`/`in` on one path), at the top or directly under `all`;
    /// values of any kind (``QueryEval/filingKey(_:)``: arrays and objects
    /// by their parts).
    static func of(_ c: CompiledCondition?) -> QueryIndexKey? {
        guard let c else { return nil }
        switch c {
        case .compare(let p, .eq, let v, _):
            return QueryIndexKey(path: p, values: [QueryEval.filingKey(v)])
        case .oneOf(let p, let keys, let others):
            // A long list is not filed value by value (that costs as much as
            // the request is long, at build and at drop): the view is tested
            // instead, one hash probe per changed entity of its type.
            guard !(keys.isEmpty && others.isEmpty), keys.count + others.count <= maxIndexedValues else { return nil }
            // Sorted: the same definition files the same way on every run.
            return QueryIndexKey(path: p, values: Array(keys.union(others.map(QueryEval.filingKey))).sorted())
        case .all(let list):
            for sub in list { if let k = of(sub) { return k } }
            return nil
        default:
            return nil
        }
    }
}
