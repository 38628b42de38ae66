import Synchronization
import ConcordJSON
import ConcordProtocol

extension Engine {
    /// Starts a subscription. With `since` (§3.2), a view nothing of which
    /// changed after that seq is answered `"unchanged":true` without its value.
    func subscribe(_ c: ClientSession, rid: JSON, name: String, target: SubscribeTarget, since: Int? = nil) throws(ProtocolError) {
        if c.subs[name] != nil {
            throw ProtocolError(.subExists, "subscription '\(clipID(name))' already exists on this connection")
        }
        if c.subs.count >= configuration.maxSubscriptionsPerConnection {
            throw ProtocolError(.limitExceeded, "this connection already has \(configuration.maxSubscriptionsPerConnection) subscriptions (the limit)")
        }
        if subscriptionCount >= configuration.maxSubscriptions {
            throw ProtocolError(.limitExceeded, "the server already holds \(configuration.maxSubscriptions) subscriptions on all connections (--max-subscriptions)")
        }
        switch target {
        case .model(let model, let refresh):
            var value = model
            // Resuming: the tree as `refresh` gives it, whether or not it is sent.
            if refresh || since != nil {
                value = tree.substituteKnown(model) { store.entity($0) }
            }
            let view = modelView(for: value)
            let s = SubscriptionRecord(client: c, name: name, kind: .model(view))
            view.add(s)
            add(s, to: c)
            if let n = since, unchangedSince(n, entities: view.ids) {
                respondUnchanged(c, rid: rid)
                return
            }
            respond(c, rid: rid) { w in w.key("model"); w.value(value); w.key("seq"); w.int(seq) }
        case .key(let key):
            let s = SubscriptionRecord(client: c, name: name, kind: .key(key))
            addKeySubscriber(s, key)
            add(s, to: c)
            // While the key is subscribed, the key table is what says its
            // document is known (see `missingKeys`): the read-through's
            // negative entry need not be kept beside it (~40 bytes a key).
            if let p = persistence, !p.knownAbsent.isEmpty { p.knownAbsent.remove(RecordCodec.documentKey(key)) }
            let v = store.document(key) ?? .null
            if let n = since, versions.document(key, present: !v.isNull) <= n, unchangedSince(n, entities: tree.identities(v).order) {
                respondUnchanged(c, rid: rid)
                return
            }
            respond(c, rid: rid) { w in w.key("model"); w.value(v); w.key("seq"); w.int(seq) }
        case .ids(let list):
            var unique: [String] = []
            var seen: Set<String> = []
            for id in list where seen.insert(id).inserted { unique.append(id) }
            let s = SubscriptionRecord(client: c, name: name, kind: .ids(unique))
            for id in unique { idWatchers[id, default: EntityWatchers()].add(s) }
            add(s, to: c)
            if let n = since, unchangedSince(n, entities: unique.flatMap { [$0] + tree.identities(store.entity($0) ?? .null).order }) {
                respondUnchanged(c, rid: rid)
                return
            }
            respond(c, rid: rid) { w in
                w.key("models")
                w.raw("{")
                for (i, id) in unique.enumerated() {
                    if i > 0 { w.raw(",") }
                    w.string(id)
                    w.raw(":")
                    w.value(store.entity(id) ?? .null)
                }
                w.raw("}")
                w.key("seq"); w.int(seq)
            }
        case .feed(let types):
            let s = SubscriptionRecord(client: c, name: name, kind: .feed(types: types.map { Set($0) }))
            feeds.add(s)
            add(s, to: c)
            if let n = since {
                guard let changed = versions.changed(after: n) else {
                    respond(c, rid: rid) { w in w.key("seq"); w.int(seq); w.key("truncated"); w.raw("true") }
                    return
                }
                let wanted = types.map { Set($0) }
                for (id, at) in changed where wanted?.contains(Tree.type(of: id)) ?? true {
                    c.output.write { w in
                        eventHeader(&w, "entity", s, at)
                        w.raw(",\"id\":"); w.string(id)
                        w.raw(",\"model\":"); w.value(store.entity(id) ?? .null)
                        w.raw(",\"replayed\":true}\n")
                    }
                }
                markDirty(c)
            }
            respond(c, rid: rid, seq: seq)
        case .query(let spec):
            let view = try queryWindow(preparedQuery(spec))
            let s = SubscriptionRecord(client: c, name: name, kind: .query(view))
            view.add(s)
            add(s, to: c)
            if let n = since, view.view.builtAt <= n, view.changedAt <= n {
                respondUnchanged(c, rid: rid)
                return
            }
            let items = queryItems(view)
            respond(c, rid: rid) { w in
                w.key("items"); w.value(.array(items))
                w.key("count"); w.int(view.count)
                w.key("seq"); w.int(seq)
            }
        case .collection(let collection):
            let view: CollectionView
            if let v = collectionViews[collection] {
                view = v
            } else {
                view = CollectionView(name: collection)
                collectionViews[collection] = view
            }
            let s = SubscriptionRecord(client: c, name: name, kind: .collection(view))
            view.add(s)
            add(s, to: c)
            let items = store.collectionItems(collection)
            if let n = since, versions.collection(collection, present: store.collections[collection] != nil) <= n,
               unchangedSince(n, entities: items.flatMap { tree.identities($0).order }) {
                respondUnchanged(c, rid: rid)
                return
            }
            respond(c, rid: rid) { w in w.key("items"); w.value(.array(items)); w.key("seq"); w.int(seq) }
        }
    }

    /// Whether none of these entities changed (or was deleted) after `n`.
    private func unchangedSince(_ n: Int, entities: some Sequence<String>) -> Bool {
        for id in entities where versions.entity(id, present: store.entity(id) != nil) > n { return false }
        return true
    }

    private func respondUnchanged(_ c: ClientSession, rid: JSON) {
        respond(c, rid: rid) { w in w.key("unchanged"); w.raw("true"); w.key("seq"); w.int(seq) }
    }

    private func add(_ s: SubscriptionRecord, to c: ClientSession) {
        c.subs[s.name] = s
        subscriptionCount += 1
        subscriptionsByKind[s.kind.metricIndex] += 1
        if c.coalescing != 0 { holdBack(s) }
    }

    /// Files a key subscription under its key: alone while it is the key's
    /// only one, in a shared view from the second on.
    private func addKeySubscriber(_ s: SubscriptionRecord, _ key: String) {
        switch keyViews[key] {
        case nil:
            keyViews.insert(.alone(s))
        case .alone(let first)?:
            let view = KeyView(key: key)
            view.add(first)
            view.add(s)
            keyViews.insert(.shared(view))
        case .shared(let view)?:
            view.add(s)
        }
    }

    /// Unfiles a key subscription; a view left with one subscription gives
    /// way to that subscription alone.
    private func removeKeySubscriber(_ s: SubscriptionRecord, _ key: String) {
        switch keyViews[key] {
        case .alone(let only)? where only === s:
            keyViews[key] = nil
        case .shared(let view)?:
            view.remove(s)
            if let last = view.only {
                view.remove(last)
                keyViews.insert(.alone(last))
            } else if view.isEmpty {
                keyViews[key] = nil
            }
        default:
            break
        }
    }

    /// Removes a subscription from every index (the caller removes it from its client).
    func unregister(_ s: SubscriptionRecord) {
        subscriptionCount -= 1
        subscriptionsByKind[s.kind.metricIndex] -= 1
        s.pause = nil
        switch s.kind {
        case .model(let view):
            view.remove(s)
            if view.isEmpty { dropModelView(view) }
        case .key(let key):
            removeKeySubscriber(s, key)
        case .ids(let list):
            for id in list {
                idWatchers[id]?.remove(s)
                if idWatchers[id]?.isEmpty == true { idWatchers[id] = nil }
            }
        case .feed:
            feeds.remove(s)
        case .collection(let view):
            view.remove(s)
            if view.isEmpty { collectionViews[view.name] = nil }
        case .query(let view):
            view.remove(s)
            if view.isEmpty { dropQueryWindow(view) }
        }
    }

    /// How many model views with one root identity `modelShares` lists.
    static let modelSharesPerRoot = 8
    /// How many values (containers, members, elements) a subscribe compares
    /// at most, over all the listed trees, looking for one written alike: a
    /// tree past it is not shared, and a subscribe costs the sequencer at
    /// most ~0.2 ms more however large or alike the trees (16 MiB of one
    /// tree compared with eight near-copies would hold everyone for seconds).
    static let modelShareBudget = 20_000

    /// The view a new model subscription with tree `value` joins: a listed
    /// one whose tree is written the same way, or a new one.
    func modelView(for value: JSON) -> ModelView {
        let root = value.objectValue?.identity(idKey: tree.idKey)
        if let root, let views = modelShares[root] {
            var budget = Self.modelShareBudget
            for v in views {
                if Self.writtenAlike(v.tree, value, budget: &budget) { return v }
                if budget <= 0 { break }
            }
        }
        let view = ModelView(tree: value, ids: tree.identitySet(value), root: root, serial: modelViewSerial)
        modelViewSerial += 1
        let oid = ObjectIdentifier(view)
        for id in view.ids { modelWatchers[id, default: [:]][oid] = view }
        if let root, modelShares[root, default: []].count < Self.modelSharesPerRoot { modelShares[root, default: []].append(view) }
        return view
    }

    /// `JSON.hasSameEncoding`, counting every value it reads off `budget`:
    /// false once the budget is spent (undecided counts as different).
    static func writtenAlike(_ a: JSON, _ b: JSON, budget: inout Int) -> Bool {
        budget -= 1
        if budget < 0 { return false }
        switch (a, b) {
        case let (.object(x), .object(y)):
            let xm = x.members, ym = y.members
            guard xm.count == ym.count else { return false }
            if sameBuffer(xm, ym) { return true }
            for i in xm.indices {
                guard sameText(xm[i].key, ym[i].key), writtenAlike(xm[i].value, ym[i].value, budget: &budget) else { return false }
            }
            return true
        case let (.array(x), .array(y)):
            guard x.count == y.count else { return false }
            if sameBuffer(x, y) { return true }
            for i in x.indices where !writtenAlike(x[i], y[i], budget: &budget) { return false }
            return true
        case (.object, _), (.array, _), (_, .object), (_, .array):
            return false
        default:
            return a.hasSameEncoding(as: b)
        }
    }

    /// A model view whose last subscriber left, or that ended: out of the indexes.
    func dropModelView(_ view: ModelView) {
        let oid = ObjectIdentifier(view)
        for id in view.ids { removeWatcher(id, oid) }
        if let root = view.root, var views = modelShares.removeValue(forKey: root) {
            views.removeAll { $0 === view }
            if !views.isEmpty { modelShares[root] = views }
        }
    }

    func removeWatcher(_ id: String, _ oid: ObjectIdentifier) {
        if var w = modelWatchers.removeValue(forKey: id) {
            w[oid] = nil
            if !w.isEmpty { modelWatchers[id] = w }
        }
    }

    // MARK: Pause and resume

    /// What the subscriber was last sent, kept so a later catch-up can be
    /// computed from it (model views keep `lastSent` themselves).
    func baseline(_ s: SubscriptionRecord) -> PauseState {
        let state = PauseState()
        switch s.kind {
        case .key(let key): state.document = store.document(key)
        case .model(let view): state.document = view.tree
        case .collection(let view): state.items = store.collectionItems(view.name)
        case .query(let view):
            state.items = queryItems(view)
            state.count = view.count
        default: break
        }
        return state
    }

    func pause(_ s: SubscriptionRecord) {
        if let p = s.pause {
            p.byUser = true
            return
        }
        let state = baseline(s)
        state.byUser = true
        s.pause = state
    }

    /// Sends at most one event taking the subscriber from what it last got to now.
    func resume(_ s: SubscriptionRecord) {
        guard let state = s.pause, state.byUser else { return }
        s.pause = nil
        writeCatchUp(s, state, coalesced: false)
        if s.client.coalescing != 0 { holdBack(s) }
    }

    /// The event(s) a `resume` sends (§5), also what coalescing writes (§6.6).
    func writeCatchUp(_ s: SubscriptionRecord, _ state: PauseState, coalesced: Bool) {
        let c = s.client
        let context = state.changed ? state.context : nil
        switch s.kind {
        case .model(let view):
            let base = state.document ?? .null
            guard view.tree != base else { return }
            c.output.append(modelEventBytes(s, seq: seq, old: base, new: view.tree, context: context, coalesced: coalesced))
        case .key(let key):
            let base = state.document
            let now = store.document(key)
            if base == now { return }
            var w = JSONWriter()
            eventHeader(&w, "update", s, seq, coalesced: coalesced)
            writeDocumentBody(&w, old: base, new: now, context: context)
            c.output.append(w.bytes)
        case .collection(let view):
            let now = store.collectionItems(view.name)
            if now == state.items { return }
            var w = JSONWriter()
            eventHeader(&w, "collection", s, seq, coalesced: coalesced)
            writeCollectionBody(&w, name: view.name, changes: [.reset(items: now)], context: context)
            c.output.append(w.bytes)
        case .query(let view):
            let now = queryItems(view)
            if now == state.items && view.count == state.count { return }
            var w = JSONWriter()
            eventHeader(&w, "query", s, seq, coalesced: coalesced)
            writeQueryBody(&w, changes: [.reset(items: now)], count: view.count, context: context)
            c.output.append(w.bytes)
        case .ids, .feed:
            for id in state.order {
                let base = state.entities[id] ?? .null
                let now = store.entity(id) ?? .null
                if base == now { continue }
                var w = JSONWriter()
                eventHeader(&w, "entity", s, seq, coalesced: coalesced)
                writeEntityBody(&w, id: id, value: now, context: context)
                c.output.append(w.bytes)
            }
        }
        markDirty(c)
    }

    // MARK: Event encoding

    /// `{"event":"<kind>","sub":<name>,"seq":<n>` — the per-subscriber head.
    func eventHeader(_ w: inout JSONWriter, _ event: StaticString, _ s: SubscriptionRecord, _ seq: Int, coalesced: Bool = false) {
        w.raw("{\"event\":\"")
        w.raw(event)
        w.raw("\",\"sub\":")
        s.writeName(&w)
        w.raw(",\"seq\":")
        w.int(seq)
        if coalesced { w.raw(",\"coalesced\":true") }
    }

    /// `,"model":…,"changed":[…],"deleted":[…][,"context":…]}\n`
    /// `valueChanged`: when `old` and `new` are the store's document before
    /// and after a mutation, the entities it changed (see `Tree.diff`).
    /// `onlyChanged`: the caller knows the one identity that changed, and that none was deleted.
    /// `lists`: the caller's `Tree.diff` of `old` and `new` (not computed again).
    func writeDocumentBody(_ w: inout JSONWriter, old: JSON?, new: JSON?, context: JSON?, valueChanged: ChangeSet? = nil,
                           onlyChanged: String? = nil, lists: (changed: [String], deleted: [String])? = nil) {
        if let id = onlyChanged {
            w.raw(",\"model\":")
            writeStored(&w, new ?? .null)
            w.raw(",\"changed\":[")
            w.string(id)
            w.raw("],\"deleted\":[]")
            writeContextAndEnd(&w, context)
            return
        }
        let (changed, deleted) = lists ?? tree.diff(old: old, new: new, valueChanged: valueChanged)
        w.raw(",\"model\":")
        writeStored(&w, new ?? .null)
        w.raw(",\"changed\":[")
        for (i, id) in changed.enumerated() {
            if i > 0 { w.raw(",") }
            w.string(id)
        }
        w.raw("],\"deleted\":[")
        for (i, id) in deleted.enumerated() {
            if i > 0 { w.raw(",") }
            w.string(id)
        }
        w.raw("]")
        writeContextAndEnd(&w, context)
    }

    /// `,"collection":…,"changes":[…][,"context":…]}\n`
    func writeCollectionBody(_ w: inout JSONWriter, name: String, changes: [CollectionStep], context: JSON?) {
        w.raw(",\"collection\":")
        w.string(name)
        w.raw(",\"changes\":")
        writeChanges(&w, changes)
        writeContextAndEnd(&w, context)
    }

    /// `[{"op":"insert",…},…]`: the change list of collection and query events.
    func writeChanges(_ w: inout JSONWriter, _ changes: [CollectionStep]) {
        w.raw("[")
        for (i, c) in changes.enumerated() {
            if i > 0 { w.raw(",") }
            switch c {
            case .insert(let index, let items):
                w.raw("{\"op\":\"insert\",\"index\":"); w.int(index)
                w.raw(",\"items\":"); w.value(.array(items)); w.raw("}")
            case .remove(let index, let count):
                w.raw("{\"op\":\"remove\",\"index\":"); w.int(index)
                w.raw(",\"count\":"); w.int(count); w.raw("}")
            case .update(let index, let item):
                w.raw("{\"op\":\"update\",\"index\":"); w.int(index)
                w.raw(",\"item\":"); w.value(item); w.raw("}")
            case .reset(let items):
                w.raw("{\"op\":\"reset\",\"items\":"); w.value(.array(items)); w.raw("}")
            }
        }
        w.raw("]")
    }

    /// `,"id":…,"model":…[,"context":…]}\n`
    func writeEntityBody(_ w: inout JSONWriter, id: String, value: JSON, context: JSON?) {
        w.raw(",\"id\":")
        w.string(id)
        w.raw(",\"model\":")
        writeStored(&w, value)
        writeContextAndEnd(&w, context)
    }

    /// A stored value, encoded as `JSONWriter.value` does, except that the
    /// very object the running request's `model` was parsed into, at any
    /// depth, is spliced from the request line (one buffer of members: the
    /// same value, so its encoding is those bytes — a write stores the
    /// model's own tree unless it has to build another). At the root: a
    /// key's document or a model view that is the written entity; below it:
    /// a model view or a document holding it.
    func writeStored(_ w: inout JSONWriter, _ value: JSON) {
        guard let (model, members) = verbatimModel else { return w.value(value) }
        // The root first (a key's document, most model views): no walk.
        // Written out here, not through `splice`: passing the tuple's parts
        // on cost a copy and a retain and release per update.
        if case .object(let o) = value, sameBuffer(o.members, members) || (verbatimShared.map { sameBuffer(o.members, $0) } ?? false) {
            w.raw(model.line, model.range)
            splicedValues.add(1, ordering: .relaxed)
            return
        }
        writeSplicing(&w, value, model, members, verbatimShared)
    }

    /// Writes `o` from the request line when it is the request's model (or
    /// the stored tree it shares); false, writing nothing, otherwise.
    @inline(__always)
    private func splice(_ w: inout JSONWriter, _ o: JSONObject, _ model: VerbatimModel, _ members: [JSONObject.Member],
                        _ shared: [JSONObject.Member]?) -> Bool {
        guard sameBuffer(o.members, members) || (shared.map { sameBuffer(o.members, $0) } ?? false) else { return false }
        w.raw(model.line, model.range)
        splicedValues.add(1, ordering: .relaxed)
        return true
    }

    private func writeSplicing(_ w: inout JSONWriter, _ value: JSON, _ model: VerbatimModel, _ members: [JSONObject.Member],
                               _ shared: [JSONObject.Member]?) {
        switch value {
        case .object(let o):
            if splice(&w, o, model, members, shared) { return }
            w.raw("{")
            o.members.withUnsafeBufferPointer { m in
                for i in m.indices {
                    if i > 0 { w.raw(",") }
                    w.string(m[i].key)
                    w.raw(":")
                    writeSplicing(&w, m[i].value, model, members, shared)
                }
            }
            w.raw("}")
        case .array(let a):
            w.raw("[")
            a.withUnsafeBufferPointer { e in
                for i in e.indices {
                    if i > 0 { w.raw(",") }
                    writeSplicing(&w, e[i], model, members, shared)
                }
            }
            w.raw("]")
        default:
            w.value(value)
        }
    }

    func writeContextAndEnd(_ w: inout JSONWriter, _ context: JSON?) {
        if let context {
            w.raw(",\"context\":")
            w.value(context)
        }
        w.raw("}\n")
    }

    func modelEventBytes(_ s: SubscriptionRecord, seq: Int, old: JSON, new: JSON, context: JSON?, coalesced: Bool = false) -> [UInt8] {
        var w = JSONWriter(capacity: 256)
        eventHeader(&w, "update", s, seq, coalesced: coalesced)
        writeDocumentBody(&w, old: old, new: new, context: context)
        return w.bytes
    }

    func deleteEventBytes(_ s: SubscriptionRecord, seq: Int, context: JSON?) -> [UInt8] {
        var w = JSONWriter(capacity: 64)
        eventHeader(&w, "delete", s, seq)
        writeContextAndEnd(&w, context)
        return w.bytes
    }
}
