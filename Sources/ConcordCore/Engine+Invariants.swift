import ConcordJSON
import ConcordProtocol

#if canImport(Glibc)
import Glibc
#endif

/// Internal consistency checks (in the spirit of swift-collections'
/// `_checkInvariants`): after every mutation, when turned on, the store's
/// indexes must agree with its records and every view index with the views.
/// Off by default and free then; `CONCORD_INTERNAL_CHECKS=1` in the
/// environment (or `EngineConfiguration.internalChecks`) turns them on for
/// stress, robustness and fuzz runs. A violation stops the process: it is a
/// bug in the core, and the state would only drift further.
extension Engine {
    /// Whether the environment asks for the checks.
    public static var internalChecksFromEnvironment: Bool {
        guard let v = getenv("CONCORD_INTERNAL_CHECKS") else { return false }
        let s = String(cString: v)
        return !s.isEmpty && s != "0"
    }

    /// Query views against a naive evaluation: members are exactly the
    /// matching entities of the type, in order, and every index agrees.
    func queryViolations() -> [String] {
        var problems: [String] = []
        func note(_ s: String) { if problems.count < 20 { problems.append(s) } }
        for (key, w) in queries.windows {
            if w.isEmpty { note("query definition \(key) has no subscriber") }
            if queries.views[w.view.key] !== w.view { note("query definition \(key): its view \(w.view.key) is not the indexed one") }
            if !w.view.windows.contains(where: { $0 === w }) { note("query definition \(key): not among its view's windows") }
            var unwindowed = w.view.spec
            unwindowed.offset = w.offset
            unwindowed.limit = w.limit
            if unwindowed.canonicalKey != key { note("query definition \(key): its view and window make \(unwindowed.canonicalKey)") }
        }
        for (key, view) in queries.views {
            if view.windows.isEmpty { note("query view \(key) has no window") }
            if view.spec.offset != 0 || view.spec.limit != nil { note("query view \(key) has a window of its own") }
            if view.touched { note("query view \(key) is still marked touched between mutations") }
            if view.byOffset.count + view.unlimited.count != view.windows.count { note("query view \(key): \(view.byOffset.count) windows by offset and \(view.unlimited.count) unlimited, of \(view.windows.count)") }
            for p in view.byOffset.structureViolations().prefix(2) { note("query view \(key): windows by offset: \(p)") }
            if let m = view.windows.compactMap(\.limit).max(), m > view.maxLimit { note("query view \(key): a window's limit \(m) passes maxLimit \(view.maxLimit)") }
            for (i, w) in view.windows.enumerated() {
                if queries.windows[w.key] !== w { note("query view \(key): window \(w.key) is not the indexed one") }
                if w.windowSlot != Int32(i) { note("query view \(key): window \(w.key) is at \(i) but thinks \(w.windowSlot)") }
                if w.limit != nil {
                    if w.offsetNode < 0 || view.byOffset.element(w.offsetNode).values.window !== w { note("query view \(key): window \(w.key) is not at its node by offset") }
                } else if w.offsetNode < 0 || Int(w.offsetNode) >= view.unlimited.count || view.unlimited[Int(w.offsetNode)] !== w {
                    note("query view \(key): window \(w.key) is not at its place among the unlimited")
                }
                if !w.pending.isEmpty { note("query definition \(w.key) holds changes between mutations") }
            }
            let prefix = view.spec.type + ":"
            let ids = queries.identities
            var expected: [OrderTree<QueryView.Placed>.Element] = []
            for (id, v) in store.entities where id.hasPrefix(prefix) && view.matches(v.value) {
                guard let h = ids.find(id) else {
                    note("query view \(key): \(id) matches but has no handle")
                    continue
                }
                expected.append(.init(values: .init(sort: view.sortValues(v.value), slot: -1), id: h))
            }
            expected.sort(by: view.tree.less)
            let actual = view.tree.ids(0 ..< view.tree.count)
            if actual != expected.map(\.id) { note("query view \(key): holds \(actual.prefix(10).map(ids.name)) but \(expected.prefix(10).map { ids.name($0.id) }) match") }
            for p in view.tree.structureViolations().prefix(3) { note("query view \(key): tree: \(p)") }
            // Every member is listed in its entity's memberships, at the slot its node keeps.
            for n in 0..<view.tree.nodeCapacity {
                let h = view.tree.id(ofNode: n)
                guard h != Identities.none else { continue }
                let slot = Int(view.tree.element(Int32(n)).values.slot)
                let listed = Int(h) < queries.memberOf.handles ? queries.memberOf.count(of: h) : 0
                if slot < 0 || slot >= listed || queries.memberOf[h, slot].view !== view || queries.memberOf[h, slot].node != Int32(n) {
                    note("query view \(key): \(ids.name(h)) is not listed to it at slot \(slot)")
                }
            }
        }
        // The membership column covers every listed handle (it grows when one is listed), and is empty when none is.
        if queries.identities.listed == 0 ? !queries.memberOf.isEmpty : queries.memberOf.handles > queries.identities.capacity {
            note("\(queries.memberOf.handles) membership lists for \(queries.identities.capacity) handles, \(queries.identities.listed) listed")
        }
        for h in 0..<UInt32(queries.identities.capacity) where queries.identities.isListed(h) && Int(h) >= queries.memberOf.handles {
            note("\(queries.identities.name(h)) is listed but has no membership list")
            break
        }
        for p in queries.identities.violations().prefix(3) { note(p) }
        // Memberships hold their views unowned: every one must be of a view
        // the registry still holds (live, or retiring until it is unfiled).
        var held = Set(queries.views.values.map(ObjectIdentifier.init))
        for v in queries.retiring[queries.retiringHead...] { if let v { held.insert(ObjectIdentifier(v)) } }
        for v in queries.retiring[..<queries.retiringHead] where v != nil { note("query view \(v!.key) is unfiled but still held") }
        // Every view the registry holds has a number, and only those do.
        if queries.memberOf.registered != held.count { note("\(queries.memberOf.registered) views numbered for memberships, \(held.count) held") }
        for v in queries.views.values where queries.memberOf.view(numbered: v.membershipNumber) !== v { note("query view \(v.key) has no number of its own") }
        for hi in 0..<queries.memberOf.handles {
            let h = UInt32(hi)
            let count = queries.memberOf.count(of: h)
            if count > 0 && (Int(h) >= queries.identities.capacity || !queries.identities.isListed(h)) { note("handle \(h), not listed, has memberships") }
            for slot in 0..<count {
                let number = queries.memberOf.number(h, slot: slot)
                guard let numbered = queries.memberOf.view(numbered: number), numbered.membershipNumber == number else {
                    note("\(queries.identities.name(h)) is listed to view number \(number), which no view has")
                    continue
                }
                let m = queries.memberOf[h, slot]
                guard held.contains(ObjectIdentifier(m.view)) else {
                    note("\(queries.identities.name(h)) is listed to a query view the registry no longer holds")
                    continue
                }
                let v = m.view
                if m.node < 0 || Int(m.node) >= v.tree.nodeCapacity || v.tree.id(ofNode: Int(m.node)) != h {
                    note("\(queries.identities.name(h)) is listed to query view \(v.key), which does not hold it there")
                    continue
                }
                let kept = v.tree.element(m.node).values.slot
                if kept != Int32(slot) { note("\(queries.identities.name(h)): query view \(v.key) is at slot \(slot) of its list but thinks \(kept)") }
                if !v.retired && queries.views[v.key] !== v { note("\(queries.identities.name(h)) is listed to query view \(v.key), which is neither live nor dropped") }
            }
        }
        let listed = queries.types.values.reduce(0) { $0 + $1.entities.count }
        let releasing = queries.releasing.count - queries.releasingHead
        if listed + releasing != queries.identities.listed { note("types list \(listed) entities and \(releasing) are being given back, \(queries.identities.listed) handles are listed") }
        let slots = queries.views.values.reduce(0) { $0 + $1.held }
        if slots != queries.heldMembers { note("query views hold \(slots) entities but \(queries.heldMembers) are counted") }
        let rangeEntries = queries.types.values.reduce(0) { $0 + $1.entitiesByRange.values.reduce(0) { $0 + $1.count } }
        if rangeEntries != queries.rangeIndexEntries { note("entity range indexes hold \(rangeEntries) entries but \(queries.rangeIndexEntries) are counted") }
        for (type, tq) in queries.types {
            let prefix = type + ":"
            for (i, v) in tq.unindexed.enumerated() where v.unindexedSlot != Int32(i) {
                note("type \(type): unindexed view \(v.key) is at \(i) but thinks \(v.unindexedSlot)")
            }
            var ranged = 0
            for (pk, entry) in tq.ranges {
                for (v, serial) in entry.tree.all() {
                    if v.range.map({ Self.pathKey($0.path) }) != pk || v.serial != serial { note("type \(type): view \(v.key) is filed under the range of \(entry.path) but is not ranged by it") }
                    if !v.retired { ranged += 1 }
                }
            }
            let live = queries.views.values.filter { $0.spec.type == type && $0.range != nil }.count
            if live != ranged { note("type \(type): \(live) live views have a range, \(ranged) are filed by one") }
            for (_, byKey) in tq.byValue {
                for (vk, filed) in byKey {
                    for (i, f) in filed.enumerated() where f.view.valueSlots[Int(f.value)] != Int32(i) || f.view.index?.values[Int(f.value)] != vk {
                        note("type \(type): view \(f.view.key) filed at \(i) under a value disagrees with its slot")
                    }
                }
            }
            let inMemory = Set(store.entities.keys.filter { $0.hasPrefix(prefix) })
            let ids = queries.identities
            if inMemory != Set(tq.entities.map(ids.name)) || inMemory.count != tq.entities.count { note("type \(type): the query index knows \(tq.entities.count) entities, memory holds \(inMemory.count)") }
            for (i, h) in tq.entities.enumerated() where ids.typeSlot[Int(h)] != Int32(i) {
                note("type \(type): \(ids.name(h)) is at \(i) of its type's list but thinks \(ids.typeSlot[Int(h)])")
            }
            for (pk, entry) in tq.paths {
                var expected: [String: Set<String>] = [:]
                for id in inMemory {
                    if let v = store.entity(id), let x = QueryEval.value(v, entry.path) { expected[QueryEval.filingKey(x), default: []].insert(id) }
                }
                let actual = (tq.entitiesByValue[pk] ?? [:]).filter { !$0.value.isEmpty }.mapValues { Set($0.map(ids.name)) }
                if actual != expected { note("type \(type): the value index of \(entry.path) disagrees with the entities") }
            }
            for (pk, index) in tq.entitiesByRange {
                if tq.ranges[pk] == nil { note("type \(type): an entity range index on \(index.path) outlived its views") }
                let expected = inMemory.compactMap { id in index.key(store.entity(id)).map { (key: $0, id: id) } }.sorted {
                    let c = RangeKey.compare($0.key, $1.key)
                    return c != 0 ? c < 0 : QueryEval.compareStrings($0.id, $1.id) < 0
                }
                let actual = index.all().map { (key: $0.key, id: ids.name($0.id)) }
                if actual.map(\.id) != expected.map(\.id) || zip(actual, expected).contains(where: { RangeKey.compare($0.key, $1.key) != 0 }) {
                    note("type \(type): the entity range index on \(index.path) disagrees with the entities")
                }
            }
        }
        return problems
    }

    /// Every disagreement found, as sentences (empty: consistent).
    public func invariantViolations() -> [String] {
        var problems = store.invariantViolations() + queryViolations()
        func note(_ s: String) { if problems.count < 40 { problems.append(s) } }
        // The stored-depth bound, which the check after each mutation keeps
        // without walking every value it writes (`Store.valueForDepthCheck`).
        let limit = configuration.maxDepth - 1
        for (id, rec) in store.entities where rec.value.nests(deeperThan: limit) { note("entity \(id) nests deeper than \(limit) levels") }
        for (key, doc) in store.documents where doc.value.nests(deeperThan: limit) { note("document \(key) nests deeper than \(limit) levels") }
        var subs = 0
        // Closed connections whose subscriptions are still being ended count too.
        let sessions = Array(clients) + closingClients[closingHead...].compactMap { $0.map { ($0.id, $0) } }
        for (id, c) in sessions {
            if c.id != id { note("client \(id) is filed as \(c.id)") }
            subs += c.subs.count
            for s in c.subs.values {
                let name = s.name
                if c.subs[name] !== s { note("client \(id): subscription \(name) is not found under its name") }
                if s.client !== c { note("client \(id): subscription \(name) points at another client") }
                switch s.kind {
                case .model(let view):
                    var found = false
                    view.forEach { if $0 === s { found = true } }
                    if !found { note("\(name): not among its model view's subscribers") }
                    let ids = Set(tree.identities(view.tree).order)
                    if ids != view.ids { note("\(name): watches \(view.ids.sorted()) but holds \(ids.sorted())") }
                    for i in view.ids where modelWatchers[i]?[ObjectIdentifier(view)] !== view {
                        note("\(name): \(i) is not indexed to its model view")
                    }
                case .key(let key):
                    var found = false
                    keyViews[key]?.forEach { if $0 === s { found = true } }
                    if !found { note("\(name): not among the subscribers of key \(key)") }
                    if case .alone? = keyViews[key], s.slot != -1 { note("\(name): alone under its key but has slot \(s.slot)") }
                case .collection(let view):
                    if collectionViews[view.name] !== view { note("\(name): collection view \(view.name) is not the indexed one") }
                    var found = false
                    view.forEach { if $0 === s { found = true } }
                    if !found { note("\(name): not among its collection view's subscribers") }
                case .ids(let list):
                    for i in list where idWatchers[i]?[ObjectIdentifier(s)] !== s { note("\(name): \(i) is not indexed to it") }
                case .feed:
                    if feeds[ObjectIdentifier(s)] !== s { note("\(name): not in the feed index") }
                case .query(let view):
                    if queries.windows[view.key] !== view { note("\(name): query definition \(view.key) is not the indexed one") }
                    var found = false
                    view.forEach { if $0 === s { found = true } }
                    if !found { note("\(name): not among its query view's subscribers") }
                }
                if let p = s.pause, p.listed, !c.coalesced.contains(where: { $0 === s }) {
                    note("\(name): marked as owed a coalesced event but not listed")
                }
            }
        }
        if subs != subscriptionCount { note("subscription count \(subscriptionCount) but clients hold \(subs)") }
        var byKind = [Int](repeating: 0, count: Self.subscriptionKindNames.count)
        for (_, c) in sessions { for s in c.subs.values { byKind[s.kind.metricIndex] += 1 } }
        if byKind != subscriptionsByKind { note("subscriptions by kind \(subscriptionsByKind) but clients hold \(byKind)") }
        // Every index entry points at a live view that holds that identity.
        for (id, views) in modelWatchers {
            for (_, v) in views {
                if v.isEmpty { note("\(id) is indexed to a model view with no subscription") }
                v.forEach { s in
                    if s.client.subs[s.name] !== s { note("\(id) is indexed to a model view of a closed subscription") }
                }
                if !v.ids.contains(id) { note("\(id) is indexed to a model view that does not hold it") }
            }
        }
        for (root, views) in modelShares {
            if views.isEmpty || views.count > Self.modelSharesPerRoot { note("model views of root \(root): \(views.count) listed") }
            for v in views {
                if v.root != root { note("a model view of root \(v.root ?? "-") is listed under \(root)") }
                if v.isEmpty { note("model views of root \(root): one has no subscription") }
                if !v.ids.isEmpty, modelWatchers[v.ids.first!]?[ObjectIdentifier(v)] !== v { note("model views of root \(root): one is not watching") }
            }
        }
        for entry in keyViews.values {
            let key = entry.key
            if case .shared(let view) = entry, !view.hasSeveral { note("key view \(key) has fewer than two subscribers (one is filed alone)") }
            entry.forEach { s in
                if s.client.subs[s.name] !== s { note("key \(key) holds a closed subscription") }
                if s.cacheKey != key { note("key \(key) holds a subscription of another key") }
            }
        }
        // A pause state belongs to a live subscription of its client.
        for (id, c) in sessions where !c.pauses.isEmpty {
            let live = Set(c.subs.values.map { ObjectIdentifier($0) })
            for k in c.pauses.keys where !live.contains(k) { note("client \(id): a pause state of a subscription that ended") }
        }
        for view in collectionViews.values {
            let name = view.name
            if view.isEmpty { note("collection view \(name) has no subscriber") }
            view.forEach { s in if s.client.subs[s.name] !== s { note("collection view \(name) holds a closed subscription") } }
        }
        for (id, watchers) in idWatchers {
            if watchers.isEmpty { note("\(id) has an empty watcher list") }
            for (_, s) in watchers.byIdentity where s.client.subs[s.name] !== s { note("\(id) is indexed to a closed ids subscription") }
        }
        for (_, s) in feeds.byIdentity where s.client.subs[s.name] !== s { note("the feed index holds a closed subscription") }
        return problems
    }

    /// Stops the process when a check fails (called after every mutation when on).
    func checkInvariantsIfEnabled() {
        guard configuration.internalChecks else { return }
        let problems = invariantViolations()
        if !problems.isEmpty {
            preconditionFailure("Concord internal check failed after seq \(seq):\n" + problems.joined(separator: "\n"))
        }
    }
}
