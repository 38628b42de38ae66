import ConcordJSON
import ConcordProtocol

/// All `query` subscriptions with one definition share one view
/// (PROTOCOL.md §3.1): every matching entity of the type, ordered, in an
/// ``OrderTree``; the window is positions `offset ..< offset + limit` of it.
///
/// A mutation hands the view each changed entity of its type in turn
/// (``apply(_:value:current:)``): the view moves it in the tree in O(log n)
/// and writes the window changes that take the previous window to the new
/// one — at most one `remove` and one `insert` for an entity that moves,
/// plus the refill of a window that lost an item. Changes of one mutation
/// accumulate in `pending` and become one event.
final class QueryView: SharedView {
    let key: String
    let spec: QuerySpec
    var tree: OrderTree<SortKey>
    /// The condition, prepared (hash sets for `in` lists).
    let condition: CompiledCondition?
    /// A member: its node in the tree (which holds its sort values) and its
    /// place in the engine's `memberOf` list of the entity (so leaving it is O(1)).
    struct Member {
        var node: Int32
        var slot: Int32
    }
    /// Each member's identity → its node and slot.
    var members: [String: Member] = [:]
    /// Window changes of the mutation being rendered, and the count before it.
    var pending: [CollectionStep] = []
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
    /// The seq when it was built, and of the last mutation that changed its
    /// window or count (`since`, §3.2).
    var builtAt = 0
    var changedAt = 0
    /// Retired views: the members still to unfile, and how far the value index is.
    var unfiling: Dictionary<String, Member>.Iterator?
    var unfiledValues = 0

    init(key: String, spec: QuerySpec) {
        self.key = key
        self.spec = spec
        condition = spec.condition.map(CompiledCondition.init)
        let order = spec.order
        tree = OrderTree(vacant: SortKey()) { a, b in
            for i in order.indices {
                var c = SortValue.compare(a.values[i], b.values[i])
                if order[i].descending { c = -c }
                if c != 0 { return c < 0 }
            }
            return QueryEval.compareStrings(a.id, b.id) < 0
        }
    }

    var count: Int { tree.count }

    /// What one member costs against `--max-query-entities`: a member keeps
    /// one sort value per order key, so it counts once per key (at least once).
    var weight: Int { max(1, spec.order.count) }

    /// This view's share of `--max-query-entities`.
    var held: Int { tree.count * weight }

    /// Window size for a list of `total` matches.
    func windowSize(_ total: Int) -> Int {
        let rest = max(0, total - spec.offset)
        if let limit = spec.limit { return min(limit, rest) }
        return rest
    }

    func windowIDs() -> [String] {
        let start = spec.offset
        return tree.ids(start ..< start + windowSize(tree.count))
    }

    func matches(_ value: JSON) -> Bool {
        guard let condition else { return true }
        return condition.matches(value)
    }

    func sortValues(_ value: JSON) -> SortKey {
        switch spec.order.count {
        case 0: return SortKey()
        case 1:
            var k = SortKey()
            k.first = SortValue(QueryEval.value(value, spec.order[0].path))
            return k
        default: return SortKey(spec.order.map { SortValue(QueryEval.value(value, $0.path)) })
        }
    }

    /// Files an entity without producing changes (building the view).
    func add(_ id: String, _ value: JSON) {
        guard matches(value) else { return }
        members[id] = Member(node: tree.insertNode(.init(values: sortValues(value), id: id)).node, slot: -1)
    }

    /// Removes an entity without producing changes (the view is being dropped).
    func dropAll() {
        members = [:]
        tree.removeAll()
        pending = []
    }

    private func sameValues(_ a: SortKey, _ b: SortKey) -> Bool {
        for i in spec.order.indices where SortValue.compare(a[i], b[i]) != 0 { return false }
        return true
    }

    /// Re-files one entity after a change (`value` nil: it is gone) and
    /// appends the window changes. `current` reads an entity's current value.
    /// Returns true when the entity is a member afterwards.
    @discardableResult
    func apply(_ id: String, value: JSON?, current: (String) -> JSON?) -> Bool {
        let old = members[id].map { tree.element($0.node).values }
        let isMember = value.map(matches) ?? false
        guard old != nil || isMember else { return false }
        // Touched only when the entity concerns it (an unindexed view tested
        // and not matched costs nothing more).
        if !touched {
            touched = true
            countBefore = tree.count
        }
        let k = spec.offset
        let n = tree.count
        func item(_ pos: Int) -> JSON { current(tree.select(pos).id) ?? .null }
        func insert(_ i: Int, _ v: JSON) { pending.append(.insert(index: i, items: [v])) }
        func remove(_ i: Int) { pending.append(.remove(index: i, count: 1)) }

        switch (old, isMember) {
        case (let ov?, true):
            let v = value!
            let nv = sortValues(v)
            let m = windowSize(n)
            if sameValues(ov, nv) {
                let r = tree.rank(.init(values: ov, id: id)) - k
                if r >= 0 && r < m { pending.append(.update(index: r, item: v)) }
                return true
            }
            let rOld = tree.remove(.init(values: ov, id: id))
            let (rNew, node) = tree.insertNode(.init(values: nv, id: id))
            members[id]!.node = node
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
            return true
        case (nil, true):
            let v = value!
            let nv = sortValues(v)
            let (rNew, node) = tree.insertNode(.init(values: nv, id: id))
            members[id] = Member(node: node, slot: -1)
            let before = windowSize(n), after = windowSize(n + 1)
            let full = spec.limit.map { before == $0 } ?? false
            let j = rNew - k
            if j < 0 {
                if after > 0 {
                    insert(0, item(k))
                    if full { remove(before) }
                }
            } else if j < after {
                insert(j, v)
                if full { remove(before) }
            }
            return true
        case (let ov?, false):
            let rOld = tree.remove(.init(values: ov, id: id))
            members[id] = nil
            let before = windowSize(n), after = windowSize(n - 1)
            let i = rOld - k
            if i < before && before > 0 {
                remove(max(i, 0))
                if after == before { insert(after - 1, item(k + after - 1)) }
            }
            return false
        case (nil, false):
            return false
        }
    }

    /// The changes of the mutation, shortened to one `reset` when that is
    /// smaller (a limited window that changed more than its size); nil when
    /// neither the window nor the count changed.
    func takeChanges(current: (String) -> JSON?) -> [CollectionStep]? {
        defer {
            pending = []
            touched = false
        }
        guard touched, !pending.isEmpty || tree.count != countBefore else { return nil }
        if let limit = spec.limit, pending.count > limit {
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

    /// The first indexable condition: `eq` on a scalar, or a set of scalars
    /// (`in`, or `any` of `eq`/`in` on one path), at the top or directly
    /// under `all`.
    static func of(_ c: CompiledCondition?) -> QueryIndexKey? {
        guard let c else { return nil }
        switch c {
        case .compare(let p, .eq, let v):
            return QueryEval.indexKey(v).map { QueryIndexKey(path: p, values: [$0]) }
        case .oneOf(let p, let keys, let others):
            // A long list is not filed value by value (that costs as much as
            // the request is long, at build and at drop): the view is tested
            // instead, one hash probe per changed entity of its type.
            guard others.isEmpty, !keys.isEmpty, keys.count <= maxIndexedValues else { return nil }
            // Sorted: the same definition files the same way on every run.
            return QueryIndexKey(path: p, values: keys.sorted())
        case .all(let list):
            for sub in list { if let k = of(sub) { return k } }
            return nil
        default:
            return nil
        }
    }
}
