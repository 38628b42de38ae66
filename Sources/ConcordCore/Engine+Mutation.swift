import ConcordJSON
import ConcordProtocol

/// One applied op, as the model views need to replay it.
enum ViewEffect {
    case update(UpdateEffect)
    case delete(Set<String>)
}

extension Engine {
    // MARK: Applying

    /// `fromLog`: read back from the cluster log (§8): an `origin` that is no
    /// longer a subscription is ignored (it was checked when appended; the
    /// outcome must not depend on one host's connections).
    func mutate(_ c: ClientSession, rid: JSON, _ m: Mutation, _ options: MutationOptions, fromLog: Bool = false) throws(ProtocolError) {
        // A retry of an accepted mutation: its original answer, first of all (§4.1).
        if answerDuplicate(c, rid: rid, token: options.token) { return }
        var origins: Set<ObjectIdentifier> = []
        if let o = options.origin {
            if let s = c.subs[o] {
                origins.insert(ObjectIdentifier(s))
            } else if !fromLog {
                throw ProtocolError(.noSuchSub, "origin '\(clipID(o))' is not a live subscription of this connection")
            }
        }
        checkCongestion()
        try checkWritable()
        if let n = options.ifUnchangedSince { try checkUnchanged(m, since: n) }
        if case .clear = m {
            clearAll(c, rid: rid, context: options.context, token: options.token)
            return
        }
        let isBatch: Bool
        var ops: [(Mutation, origin: String?)]
        if case .batch(let list) = m {
            isBatch = true
            ops = list
        } else {
            isBatch = false
            ops = opsScratch
            opsScratch = []
            ops.append((m, nil))
        }
        // Both lists go back to their scratch places emptied (an error
        // leaves them to be made again next time).
        defer {
            if !isBatch {
                ops.drain()
                opsScratch = ops
            }
        }
        // A single op carries no origin of its own (its options' was looked at above).
        if isBatch {
            for i in ops.indices {
                guard let o = ops[i].origin else { continue }
                guard let s = c.subs[o] else {
                    if fromLog { continue }
                    throw ProtocolError(.noSuchSub, "ops[\(i)]: origin '\(clipID(o))' is not a live subscription of this connection")
                }
                origins.insert(ObjectIdentifier(s))
            }
        }

        var effects = effectsScratch
        effectsScratch = []
        var written = writtenScratch
        writtenScratch = []
        defer {
            written.drain(keepingAtMost: 4096)
            writtenScratch = written
            // A single update's entity map goes back to the store to be
            // filled again by the next update (nothing holds it any more
            // once the effects are gone).
            var spare = EntityMap()
            // Moved out of the list, not copied from it.
            if effects.count == 1, case .update(let u) = effects.removeLast() { spare = u.swap }
            effects.drain()
            effectsScratch = effects
            store.reuse(&spare)
        }
        var change = StoreChange()
        store.trackRecordChanges = !feeds.isEmpty
        var index = 0
        do throws(ProtocolError) {
            // By index: a loop over the pairs copied each (its mutation and origin) and destroyed the copy.
            for i in ops.indices {
                index = i
                switch ops[i].0 {
                case .update(let model, let key, let mode, let force):
                    let prepared = try store.prepareUpdate(model: model, key: key, mode: mode, force: force)
                    if ops.count == 1 { store.apply(prepared, into: &change) } else { change.formUnion(store.apply(prepared)) }
                    if let m = store.sharedRoot, verbatimModel != nil { verbatimShared = m }
                    prepared.values.forEachID { written.append($0) }
                    effects.append(.update(UpdateEffect(swap: prepared.values, partials: prepared.partials, force: force)))
                case .deleteEntity(let id):
                    let ch = store.deleteEntity(id)
                    change.formUnion(ch)
                    effects.append(.delete(Set(ch.deleted)))
                case .deleteKey(let key):
                    change.formUnion(store.deleteDocument(key))
                case .collectionSet(let name, let items):
                    let (ch, prepared) = try store.collectionSet(name, items: items)
                    change.formUnion(ch)
                    prepared.values.forEachID { written.append($0) }
                    effects.append(.update(UpdateEffect(swap: prepared.values, partials: nil, force: false)))
                case .collectionInsert(let name, let index, let items):
                    let (ch, prepared) = try store.collectionInsert(name, index: index, items: items)
                    change.formUnion(ch)
                    prepared.values.forEachID { written.append($0) }
                    effects.append(.update(UpdateEffect(swap: prepared.values, partials: nil, force: false)))
                case .collectionRemoveAt(let name, let index, let count):
                    try store.collectionRemove(name, index: index, count: count)
                case .collectionRemoveIDs(let name, let ids):
                    store.collectionRemoveIDs(name, ids: ids)
                case .collectionDelete(let name):
                    change.formUnion(store.collectionDelete(name))
                case .batch, .clear:
                    throw ProtocolError(.badRequest, "not allowed in a batch")
                }
            }
            try checkStoredDepth(change)
        } catch {
            store.rollback()
            throw isBatch ? error.prefixed("ops[\(index)]") : error
        }
        seq += 1
        render(effects: effects, change: change, net: ops.count == 1, origins: origins, context: options.context)
        let expired = recordVersions(change, written: written, ops: ops, token: options.token)
        recordWrites(token: options.token, expiredTokens: expired)
        store.commit()
        if holdUntilDurable(c, rid: rid) { return }
        respond(c, rid: rid, seq: seq)
    }

    /// Stored values never nest deeper than a request may (`--max-depth` − 1:
    /// the request object is level 1), however entities are combined: every
    /// reader (encoder, record codec, SDK) can then rely on that bound.
    private func checkStoredDepth(_ change: StoreChange) throws(ProtocolError) {
        let limit = configuration.maxDepth - 1
        // Referrers refreshed by substitution (an author's hundred posts)
        // nest deeper only when an entity written here does. Unless one does,
        // only the records written here are looked at — not the referrers —
        // and of those only the ones not written as they came.
        func check(_ id: String, _ v: JSON?) throws(ProtocolError) {
            if let v, v.nests(deeperThan: limit) {
                throw ProtocolError(.tooDeep, "the value of '\(clipID(id))' would nest deeper than \(limit) levels with its entities; nothing was applied")
            }
        }
        if change.valueChanged.count == 1 || !store.aHeldEntityNestsDeeper(limit: limit) {
            for (id, rec) in store.writtenInMutation where store.isResident(rec) {
                try check(id, store.valueForDepthCheck(rec))
            }
        } else {
            for id in change.valueChanged { try check(id, store.valueForDepthCheck(id)) }
        }
        // The update's own document, changed as its root entity did
        // (`Store.rootOfDocument`), is that entity's stored value: when it is
        // the only document changed, there is nothing more to look at.
        if store.rootOfDocument != nil && change.documentsChanged.count == 1 { return }
        for key in change.documentsChanged {
            // A document whose root is an entity is that entity's stored
            // value, checked above (or unchanged and checked before).
            if let v = store.document(key), v.identity(idKey: configuration.idKey) == nil, v.nests(deeperThan: limit) {
                throw ProtocolError(.tooDeep, "the document '\(clipID(key))' would nest deeper than \(limit) levels with its entities; nothing was applied")
            }
        }
    }

    private func clearAll(_ c: ClientSession, rid: JSON, context: JSON?, token: String?) {
        seq += 1
        versions.cleared(seq: seq)
        if let token { versions.remember(token: token, seq: seq, now: versionsNow) }
        for client in clients.values {
            for s in Self.ordered(client.subs.values) {
                client.output.append(deleteEventBytes(s, seq: seq, context: context))
                // A model view and its subscribers hold each other: break the links.
                if case .model(let view) = s.kind { view.removeAll() }
            }
            if !client.subs.isEmpty { markDirty(client) }
            client.subs.removeAll()
            client.pauses.removeAll()
            client.coalesced = []
        }
        modelWatchers = [:]
        modelShares = [:]
        // A collection view and its subscribers hold each other: break the
        // links (a key's subscriptions do not hold their view).
        for v in collectionViews.values { v.removeAll() }
        keyViews.removeAll()
        collectionViews.removeAll()
        clearQueries()
        idWatchers = [:]
        feeds = EntityWatchers()
        subscriptionCount = 0
        for i in subscriptionsByKind.indices { subscriptionsByKind[i] = 0 }
        store.clear()
        recordClear()
        if holdUntilDurable(c, rid: rid) { return }
        respond(c, rid: rid, seq: seq)
    }

    // MARK: Rendering

    /// One mutation's events: plan (which views, what each needs), map
    /// (their bytes, in parallel), enqueue (serial, in PROTOCOL §6's order).
    /// Render+Plan.swift, Render+Map.swift, Render+Enqueue.swift.
    private func render(effects: [ViewEffect], change: StoreChange, net: Bool, origins: Set<ObjectIdentifier>, context: JSON?) {
        var plan = planRender(effects: effects, change: change, net: net)
        // The map step looks entities up in the change set (a document's diff): hashed throughout.
        let results: RenderResults
        if !plan.jobs.isEmpty && change.valueChanged.unhashedCount > 0 {
            var valueChanged = change.valueChanged
            valueChanged.hashAll()
            results = mapRender(plan, effects: effects, seq: seq, origins: origins, context: context, valueChanged: valueChanged)
        } else {
            results = mapRender(plan, effects: effects, seq: seq, origins: origins, context: context, valueChanged: change.valueChanged)
        }
        enqueueRender(plan, results, change: change, seq: seq, origins: origins, context: context)
        results.reset(count: 0)  // what the slots held is queued (or dropped) by now
        plan.jobs.drain()
        swap(&plan.jobs, &jobsScratch)
    }

    /// The fixed order of subscriptions within one mutation's events: by
    /// connection, then by name (unique on a connection).
    static func precedes(_ a: SubscriptionRecord?, _ b: SubscriptionRecord?) -> Bool {
        guard let a, let b else { return a == nil && b != nil }
        if a.client.id != b.client.id { return a.client.id < b.client.id }
        return a.name < b.name
    }

    static func ordered(_ subs: some Sequence<SubscriptionRecord>) -> [SubscriptionRecord] {
        var list = Array(subs)
        if list.count > 1 { list.sort { precedes($0, $1) } }
        return list
    }

    /// Ends every subscription of a shared view whose document or collection went away.
    /// The caller unfiles the view.
    func endAll(_ view: some SubscriberList, seq: Int, context: JSON?) {
        view.forEach { s in
            s.client.output.append(deleteEventBytes(s, seq: seq, context: context))
            markDirty(s.client)
            forgetEnded(s)
        }
    }

    /// A subscription its view ended (its last event is queued): gone from
    /// its connection and the counts. The caller unfiles the view itself.
    func forgetEnded(_ s: SubscriptionRecord) {
        s.client.subs[s.name] = nil
        s.pause = nil
        s.slot = -1
        subscriptionCount -= 1
        subscriptionsByKind[s.kind.metricIndex] -= 1
    }

    /// One shared payload to every running subscriber of a view, each with its own header.
    /// `changed`: false when a forced write changed nothing (a held-back
    /// subscription then keeps the context of the last real change, §5).
    func send(_ payload: OutputBytes, to view: some SubscriberList, event: StaticString, seq: Int, changed: Bool,
                      origins: Set<ObjectIdentifier>, context: JSON?) {
        var shared: SharedEvent?
        let several = view.hasSeveral
        view.forEachUnretained { s in
            // The connection outlives its subscriptions: borrowed, not retained.
            Unmanaged.passUnretained(s.client)._withUnsafeGuaranteedRef { c in
                if !c.pauses.isEmpty, let p = c.pauses[ObjectIdentifier(s)] {
                    if changed { noteChange(s, p, context: context) }
                    return
                }
                if !origins.isEmpty && origins.contains(ObjectIdentifier(s)) { return }
                enqueue(&shared, several, event, seq, payload, to: s, of: c)
            }
        }
    }

    /// Queues one event of a view to `s`. With several subscribers and a
    /// payload that is copied anyway (`OutputQueue.copyLimit`), what they
    /// share — the head before the name, and `,"seq":N` with the payload
    /// after it — is written once, at the first of them, and each adds only
    /// its name (no number formatted, no header written piece by piece); for
    /// one subscriber, sharing costs more than it saves.
    /// `c`: the subscription's connection, borrowed by the caller.
    @inline(__always)
    func enqueue(_ shared: inout SharedEvent?, _ several: Bool, _ event: StaticString, _ seq: Int,
                 _ payload: OutputBytes, to s: SubscriptionRecord, of c: ClientSession) {
        if several && payload.count <= OutputQueue.copyLimit {
            if shared == nil { shared = SharedEvent(event, seq, payload, into: sharedEventScratch) }
            c.output.appendEvent(head: shared!.head, s, tail: shared!.tail)
        } else {
            if !c.output.appendEventHeader(event, s, seq: seq) {
                c.output.write { eventHeader(&$0, event, s, seq) }
            }
            c.output.append(shared: payload)
        }
        markDirty(c)
    }

    /// One entity event to `s` (an `ids` or `feed` subscription). `shared`
    /// and `several` as for `enqueue`: the event's bytes around the name are
    /// written once for the entity's watchers.
    func sendEntity(_ s: SubscriptionRecord, _ id: String, _ payload: OutputBytes, seq: Int, changed: Bool,
                    origins: Set<ObjectIdentifier>, context: JSON?, shared: inout SharedEvent?, several: Bool) {
        if let p = s.pause {
            guard changed else { return }
            if p.entities[id] == nil {
                p.entities[id] = store.valueBeforeMutation(id)
                p.order.append(id)
            }
            noteChange(s, p, context: context)
            return
        }
        if !origins.isEmpty && origins.contains(ObjectIdentifier(s)) { return }
        // The connection outlives its subscriptions: borrowed, not retained.
        Unmanaged.passUnretained(s.client)._withUnsafeGuaranteedRef { c in
            enqueue(&shared, several, "entity", seq, payload, to: s, of: c)
        }
    }

    /// Replays the mutation's ops on one model view's tree. Runs on a
    /// worker: touches only this view. Writes the body of the view's
    /// `update` event once for all its subscribers (`enqueueRender` adds
    /// each one's header): they all hold the tree as it was before.
    func renderModel(_ view: ModelView, _ effects: [ViewEffect], context: JSON?, origins: Set<ObjectIdentifier>,
                     buffer: inout [UInt8], slot: Int) -> ModelRender {
        var t = view.tree
        var ids = view.ids
        var idsFresh = true
        var forced = false
        var touched = false
        var result = ModelRender()
        let requiredFn: (String) -> Set<String>? = { self.store.requiredMembers($0) }
        for e in effects {
            if !idsFresh {
                ids = tree.identitySet(t, expected: ids.count)
                idsFresh = true
            }
            switch e {
            case .update(let u):
                guard u.swap.intersects(ids) else { continue }
                let (nt, c) = tree.rewrite(t, u)
                if c {
                    t = nt
                    idsFresh = false
                    touched = true
                }
                if u.force { forced = true }
            case .delete(let d):
                guard !ids.isDisjoint(with: d) else { continue }
                switch tree.prune(t, deleted: d, required: requiredFn) {
                case .deleted:
                    result.ended = true
                    return result
                case .kept(let nt):
                    t = nt
                    idsFresh = false
                    touched = true
                }
            }
        }
        let old = view.tree
        // What changed, from one walk of both trees (`Tree.diff`): the tree
        // changes only where an entity was swapped, merged or pruned, so it
        // changed exactly when an identity is listed. When every identity
        // kept its place (`changedInSameShape`), the view watches the same
        // ones: its identity set is not built again.
        var lists: (changed: [String], deleted: [String]) = ([], [])
        if touched {
            if let same = tree.changedInSameShape(old, t) {
                lists = (same, [])
            } else {
                lists = tree.diffByIdentities(old: old, new: t)
                result.newIDs = idsFresh ? ids : tree.identitySet(t, expected: ids.count)
            }
        }
        let changed = !lists.changed.isEmpty || !lists.deleted.isEmpty
        if configuration.internalChecks {
            if changed != (t != old) { preconditionFailure("Concord internal check failed: a model view's diff says \(changed) but its trees say \(t != old)") }
            if result.newIDs == nil && tree.identitySet(t) != view.ids { preconditionFailure("Concord internal check failed: a model view's identities moved but were kept") }
        }
        view.tree = t
        result.changed = changed
        guard changed || forced else { return result }
        // A lone subscriber that gets no event (paused, or the writer's own
        // view) needs no body: `send` notes the change in its pause state.
        if let s = view.only, s.paused || origins.contains(ObjectIdentifier(s)) {
            result.unsent = true
            return result
        }
        var w = writer(&buffer, capacity: 512)
        writeDocumentBody(&w, old: old, new: t, context: context, lists: lists)
        result.payload = payloadBytes(&w, &buffer, slot: slot)
        return result
    }
}

/// What every subscriber of a fan-out shares of an event: the head before
/// the subscription's name (`{"event":"…","sub":`) and the tail after it
/// (`,"seq":N` and the payload), written once, straight into the engine's
/// `sharedEventScratch` (no writer, no array). It lives while one view's
/// subscribers are queued (each queue copies it: the payload is at most
/// `OutputQueue.copyLimit` long); the next fan-out writes over it.
struct SharedEvent {
    let head: UnsafeRawBufferPointer
    let tail: UnsafeRawBufferPointer

    init(_ event: StaticString, _ seq: Int, _ payload: OutputBytes, into scratch: ByteScratch) {
        let open: StaticString = "{\"event\":\"", sub: StaticString = "\",\"sub\":", seqName: StaticString = ",\"seq\":"
        // Seqs are never negative; the writer covers one all the same.
        let negative: [UInt8]? = seq < 0 ? { var w = JSONWriter(capacity: 24); w.int(seq); return w.bytes }() : nil
        let digits = Digits(Swift.max(seq, 0))
        let number = negative?.count ?? digits.count
        let headCount = open.utf8CodeUnitCount + event.utf8CodeUnitCount + sub.utf8CodeUnitCount
        let total = headCount + seqName.utf8CodeUnitCount + number + payload.count
        let base = scratch.room(total)
        var p = base
        @inline(__always) func put(_ from: UnsafeRawPointer, _ count: Int) {
            p.copyMemory(from: from, byteCount: count)
            p += count
        }
        put(open.utf8Start, open.utf8CodeUnitCount)
        put(event.utf8Start, event.utf8CodeUnitCount)
        put(sub.utf8Start, sub.utf8CodeUnitCount)
        put(seqName.utf8Start, seqName.utf8CodeUnitCount)
        if let negative {
            negative.withUnsafeBytes { put($0.baseAddress!, number) }
        } else {
            digits.copy(to: p)
            p += number
        }
        if payload.count > 0 { put(UnsafeRawPointer(payload.base), payload.count) }
        head = UnsafeRawBufferPointer(start: base, count: headCount)
        tail = UnsafeRawBufferPointer(start: base + headCount, count: total - headCount)
    }
}

/// Bytes the sequencer writes and reads within one step (a fan-out's shared
/// event): one allocation, grown when a step needs more, never shrunk (a
/// shared event is at most `OutputQueue.copyLimit` plus its header).
final class ByteScratch {
    private var base: UnsafeMutableRawPointer
    private var capacity: Int

    init(capacity: Int) {
        self.capacity = Swift.max(capacity, 1)
        base = .allocate(byteCount: self.capacity, alignment: 8)
    }

    deinit { base.deallocate() }

    /// Room for `n` bytes (what was there before is gone).
    @inline(__always)
    func room(_ n: Int) -> UnsafeMutableRawPointer {
        if n > capacity {
            base.deallocate()
            capacity = Swift.max(n, capacity * 2)
            base = .allocate(byteCount: capacity, alignment: 8)
        }
        return base
    }
}
