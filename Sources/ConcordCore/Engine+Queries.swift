import ConcordJSON
import ConcordProtocol

/// The live queries of one entity type, and how an update finds its candidates.
///
/// An entity that changes is handed to (1) the views it is a member of
/// (`memberOf`), (2) the views whose equality condition its new value meets
/// (`byValue`, looked up per indexed path: a hash probe each), and (3) the
/// views that cannot be indexed (`unindexed`: every one of them is tested).
/// So the work of a mutation grows with the entities it changes and the
/// queries they can affect, not with the number of live queries — except
/// for unindexed ones, which cost one predicate test per changed entity of
/// their type each.
final class TypeQueries {
    /// path (joined by NUL) → value key → views.
    var byValue: [String: [String: [QueryView]]] = [:]
    /// path (joined by NUL) → how many views are filed under it.
    var paths: [String: (path: QueryPath, views: Int)] = [:]
    var unindexed: [QueryView] = []
    var viewCount = 0
    /// Every entity of the type in memory: built on the first query of the
    /// type, kept up to date while one lives (a new definition scans it).
    var entities: Set<String> = []
    /// path → value key → entities with that value (for building indexed
    /// views without scanning the whole type). An entity's old key is read
    /// from its value before the mutation, so none is stored per entity.
    var entitiesByValue: [String: [String: Set<String>]] = [:]
}

/// The query views one entity is a member of. Most entities are in one:
/// it is kept inline, and an array is only allocated for a second.
struct ViewList {
    private(set) var first: QueryView
    private var rest: [QueryView] = []

    init(_ view: QueryView) { first = view }

    mutating func append(_ view: QueryView) { rest.append(view) }

    func contains(_ view: QueryView) -> Bool { first === view || rest.contains { $0 === view } }

    func forEach(_ body: (QueryView) -> Void) {
        body(first)
        for v in rest { body(v) }
    }

    /// Removes `view`; false when nothing is left.
    mutating func remove(_ view: QueryView) -> Bool {
        if first === view {
            guard let last = rest.popLast() else { return false }
            first = last
            return true
        }
        rest.removeAll { $0 === view }
        return true
    }
}

/// Queries' state in the engine.
final class QueryRegistry {
    var views: [String: QueryView] = [:]
    var types: [String: TypeQueries] = [:]
    /// Entity → the views it is a member of.
    var memberOf: [String: ViewList] = [:]
    /// Entities all views hold together (the sum of their counts), kept as
    /// views are built, dropped and changed (`--max-query-entities`).
    var heldMembers = 0
}

extension Engine {
    static func pathKey(_ p: QueryPath) -> String { p.joined(separator: "\u{0}") }

    /// The view for a definition: shared when it exists, else built from the
    /// entities of its type in memory.
    func queryView(_ spec: QuerySpec) throws(ProtocolError) -> QueryView {
        let key = spec.canonicalKey
        if let v = queries.views[key] { return v }
        if queries.views.count >= configuration.maxQueryViews {
            throw ProtocolError(.limitExceeded, "the server already keeps \(configuration.maxQueryViews) live query definitions (--max-query-views); share a definition or drop one")
        }
        let view = QueryView(key: key, spec: spec)
        let tq = typeQueries(spec.type)
        view.index = QueryIndexKey.of(spec.condition)
        // Build: candidates from the value index when the view has one.
        if let idx = view.index {
            let pk = Self.pathKey(idx.path)
            ensureValueIndex(tq, idx.path)
            var candidates: [String] = []
            for vk in idx.values { candidates.append(contentsOf: tq.entitiesByValue[pk]?[vk] ?? []) }
            for id in candidates { if let v = store.entity(id) { view.add(id, v) } }
            for vk in idx.values { tq.byValue[pk, default: [:]][vk, default: []].append(view) }
            tq.paths[pk] = (idx.path, (tq.paths[pk]?.views ?? 0) + 1)
        } else {
            for id in tq.entities { if let v = store.entity(id) { view.add(id, v) } }
            tq.unindexed.append(view)
        }
        for id in view.members.keys {
            if queries.memberOf[id] == nil { queries.memberOf[id] = ViewList(view) } else { queries.memberOf[id]!.append(view) }
        }
        tq.viewCount += 1
        queries.views[key] = view
        // Memory is bounded by configuration: every view holds all its matches.
        queries.heldMembers += view.count
        if queries.heldMembers > configuration.maxQueryEntities {
            let n = view.count
            dropQueryView(view)
            throw ProtocolError(.limitExceeded, "this query matches \(n) entities; with the live queries already kept that is over \(configuration.maxQueryEntities) (--max-query-entities): narrow it with a condition")
        }
        return view
    }

    private func typeQueries(_ type: String) -> TypeQueries {
        if let t = queries.types[type] { return t }
        let t = TypeQueries()
        let prefix = type + ":"
        for id in store.entities.keys where id.hasPrefix(prefix) { t.entities.insert(id) }
        queries.types[type] = t
        return t
    }

    private func ensureValueIndex(_ tq: TypeQueries, _ path: QueryPath) {
        let pk = Self.pathKey(path)
        guard tq.entitiesByValue[pk] == nil else { return }
        var byValue: [String: Set<String>] = [:]
        for id in tq.entities {
            guard let v = store.entity(id), let x = QueryEval.value(v, path), let k = QueryEval.indexKey(x) else { continue }
            byValue[k, default: []].insert(id)
        }
        tq.entitiesByValue[pk] = byValue
    }

    /// A view lost its last subscriber: unfile it and forget its members.
    func dropQueryView(_ view: QueryView) {
        queries.views[view.key] = nil
        queries.heldMembers -= view.count
        for id in view.members.keys {
            if var list = queries.memberOf[id] {
                queries.memberOf[id] = list.remove(view) ? list : nil
            }
        }
        view.dropAll()
        guard let tq = queries.types[view.spec.type] else { return }
        if let idx = view.index {
            let pk = Self.pathKey(idx.path)
            for vk in idx.values {
                tq.byValue[pk]?[vk]?.removeAll { $0 === view }
                if tq.byValue[pk]?[vk]?.isEmpty == true { tq.byValue[pk]?[vk] = nil }
            }
            let left = (tq.paths[pk]?.views ?? 1) - 1
            if left == 0 {
                tq.paths[pk] = nil
                tq.byValue[pk] = nil
                tq.entitiesByValue[pk] = nil
            } else {
                tq.paths[pk]?.views = left
            }
        } else {
            tq.unindexed.removeAll { $0 === view }
        }
        tq.viewCount -= 1
        if tq.viewCount == 0 {
            queries.types[view.spec.type] = nil
            // Its entities may be evicted again; a later query lists them anew.
            persistence?.loadedTypes.remove(view.spec.type)
        }
    }

    /// The current window's values.
    func queryItems(_ view: QueryView) -> [JSON] {
        view.windowIDs().map { store.entity($0) ?? .null }
    }

    /// `get` with a query: answered from a shared view when one exists, else
    /// from a view built for this read and dropped at once.
    func readQuery(_ spec: QuerySpec) throws(ProtocolError) -> (items: [JSON], count: Int) {
        if let v = queries.views[spec.canonicalKey] { return (queryItems(v), v.count) }
        let view = try queryView(spec)
        let result = (queryItems(view), view.count)
        dropQueryView(view)
        return result
    }

    // MARK: Maintenance

    /// Hands every changed entity of a queried type to the views it can
    /// affect, in a fixed order; returns the views that changed, ordered by
    /// definition, with their changes.
    func updateQueries(_ change: StoreChange) -> [(QueryView, [CollectionStep])] {
        guard !queries.types.isEmpty else { return [] }
        var changed: [(id: String, tq: TypeQueries)] = []
        for id in change.valueChanged {
            if let tq = queries.types[Tree.type(of: id)] { changed.append((id, tq)) }
        }
        for id in change.deleted where !change.valueChanged.contains(id) {
            if let tq = queries.types[Tree.type(of: id)] { changed.append((id, tq)) }
        }
        guard !changed.isEmpty else { return [] }
        // A fixed order (Set order is not): the same input gives the same events.
        if changed.count > 1 { changed.sort { $0.id < $1.id } }
        var touched: [QueryView] = []
        let current: (String) -> JSON? = { self.store.entity($0) }
        for (id, tq) in changed {
            let value = store.entity(id)
            // Written back to what it was (within a batch): nothing to do.
            let before = store.valueBeforeMutation(id)
            if before == (value ?? .null) { continue }
            // The type's entity set and value indexes.
            if value == nil { tq.entities.remove(id) } else if before == .null { tq.entities.insert(id) }
            for (pk, entry) in tq.paths {
                let newKey = value.flatMap { QueryEval.value($0, entry.path) }.flatMap(QueryEval.indexKey)
                let oldKey = before == .null ? nil : QueryEval.value(before, entry.path).flatMap(QueryEval.indexKey)
                if oldKey != newKey {
                    if let oldKey { tq.entitiesByValue[pk]?[oldKey]?.remove(id) }
                    if let newKey { tq.entitiesByValue[pk]?[newKey, default: []].insert(id) }
                }
            }
            // Candidates: where it is, where its new value may put it, and the unindexed.
            var candidates: [QueryView] = []
            queries.memberOf[id]?.forEach { candidates.append($0) }
            if let value {
                for (pk, entry) in tq.paths {
                    guard let x = QueryEval.value(value, entry.path), let vk = QueryEval.indexKey(x),
                          let views = tq.byValue[pk]?[vk] else { continue }
                    candidates.append(contentsOf: views)
                }
            }
            candidates.append(contentsOf: tq.unindexed)
            if candidates.isEmpty { continue }
            // Every view it was in is a candidate: its memberOf is rebuilt from the results.
            var members: [QueryView] = []
            if candidates.count == 1 {
                let view = candidates[0]
                let listed = view.touched
                if view.apply(id, value: value, current: current) { members.append(view) }
                if !listed && view.touched { touched.append(view) }
            } else {
                var seen: Set<ObjectIdentifier> = []
                for view in candidates where seen.insert(ObjectIdentifier(view)).inserted {
                    let listed = view.touched
                    if view.apply(id, value: value, current: current) { members.append(view) }
                    if !listed && view.touched { touched.append(view) }
                }
            }
            if members.isEmpty {
                queries.memberOf[id] = nil
            } else {
                var list = ViewList(members[0])
                for v in members.dropFirst() { list.append(v) }
                queries.memberOf[id] = list
            }
        }
        touched.sort { $0.key < $1.key }
        var out: [(QueryView, [CollectionStep])] = []
        for view in touched {
            queries.heldMembers += view.count - view.countBefore
            if let changes = view.takeChanges(current: current) { out.append((view, changes)) }
        }
        return out
    }

    /// Queues one mutation's query events (serial part of rendering).
    func sendQueryEvents(_ list: [(QueryView, [CollectionStep])], seq: Int, context: JSON?) {
        for (view, changes) in list {
            var w = JSONWriter(capacity: 128)
            writeQueryBody(&w, changes: changes, count: view.count, context: context)
            let payload = OutputBytes(w.bytes)
            // `origin` does not suppress query events (§3.1): no origins here.
            view.forEach { s in
                if let p = s.pause {
                    p.changed = true
                    p.context = context
                    noteHeldBack(s, p)
                    return
                }
                s.client.output.write { eventHeader(&$0, "query", s, seq) }
                s.client.output.append(shared: payload)
                markDirty(s.client)
            }
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
        for v in queries.views.values { v.dropAll(); v.removeAll() }
        queries.views = [:]
        queries.types = [:]
        queries.memberOf = [:]
        queries.heldMembers = 0
    }
}
