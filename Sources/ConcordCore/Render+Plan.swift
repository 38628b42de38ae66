import ConcordJSON

/// One mutation's events, step one of three (plan → map → enqueue): which
/// views the mutation reaches and what each needs, in PROTOCOL §6's order.
/// Pure reads of the store and the view indexes; nothing is written.
struct RenderPlan {
    /// What one affected view (or one entity's watchers) needs.
    enum Job {
        /// Replay the mutation's ops on a model view's private tree.
        case model(ModelView)
        /// A key view: its document's new value (`ended`: the document went
        /// away, its subscriptions end; nothing to render). `changed` is
        /// known when the change sets are net (one op); nil: compare.
        case key(KeySubscribers, forced: Bool, ended: Bool, changed: Bool?)
        /// A collection view: its change list (`ended`: the collection was dropped).
        case list(CollectionView, ended: Bool, changed: Bool, changes: [CollectionStep])
        /// An entity's `entity` event, for its ids watchers and the feeds.
        case entity(String, changed: Bool)
    }

    /// In enqueue order: models (by subscription), keys (by key), lists
    /// (by name), entities (by identity). Query views come after, apart.
    var jobs: [Job] = []
    /// Whether any job needs the map step (an ended view renders nothing).
    var renders = false
}

extension Engine {
    /// Step one: the affected views and what each needs.
    /// `net`: the change sets compare with the state before the mutation
    /// (one op; in a batch a later op may undo an earlier one's change).
    func planRender(effects: [ViewEffect], change: StoreChange, net: Bool) -> RenderPlan {
        var plan = RenderPlan()
        // The job list of the previous mutation, emptied (`render` gives it
        // back): no allocation for the list per mutation.
        swap(&plan.jobs, &jobsScratch)

        // Model views holding any identity the mutation touched.
        if !modelWatchers.isEmpty {
            var models: [ModelView] = []
            // Each view once: marked with this plan's number (no set of them).
            modelPlanMark &+= 1
            let mark = modelPlanMark
            func collect(_ ids: some Sequence<String>) {
                for id in ids {
                    guard let ws = modelWatchers[id] else { continue }
                    for (_, v) in ws where v.planMark != mark {
                        v.planMark = mark
                        models.append(v)
                    }
                }
            }
            for e in effects {
                switch e {
                case .update(let u): collect(u.swap.ids)
                case .delete(let d): collect(d)
                }
            }
            // Every list below is put in a fixed order (Set and Dictionary
            // iteration order is not): the same input gives the same bytes on
            // every run and at any --threads.
            if models.count > 1 { models.sort { $0.serial < $1.serial } }
            for v in models { plan.jobs.append(.model(v)) }
            plan.renders = plan.renders || !models.isEmpty
        }

        // Key views of changed, forced or deleted documents.
        if !keyViews.isEmpty {
            // The three sets, each key once, without building their union;
            // the jobs go straight into the plan and are put in key order there.
            let start = plan.jobs.count
            func add(_ v: KeySubscribers, _ key: String) {
                let ended = change.documentsDeleted.contains(key)
                plan.jobs.append(.key(v, forced: change.documentsForced.contains(key), ended: ended,
                                      changed: net ? change.documentsChanged.contains(key) : nil))
                if !ended { plan.renders = true }
            }
            for key in change.documentsChanged {
                if let v = keyViews[key] { add(v, key) }
            }
            for key in change.documentsForced where !change.documentsChanged.contains(key) {
                if let v = keyViews[key] { add(v, key) }
            }
            for key in change.documentsDeleted where !change.documentsChanged.contains(key) && !change.documentsForced.contains(key) {
                if let v = keyViews[key] { add(v, key) }
            }
            if plan.jobs.count - start > 1 {
                plan.jobs[start...].sort { a, b in
                    guard case .key(let x, _, _, _) = a, case .key(let y, _, _, _) = b else { return false }
                    return x.key < y.key
                }
            }
        }

        // Collection views with changes, or dropped.
        if !collectionViews.isEmpty {
            var lists: [CollectionView] = []
            for name in Set(store.collectionChanges.keys).union(change.collectionsDeleted) {
                if let v = collectionViews[name] { lists.append(v) }
            }
            if lists.count > 1 { lists.sort { $0.name < $1.name } }
            for v in lists {
                let ended = change.collectionsDeleted.contains(v.name)
                let changes = store.collectionChanges[v.name] ?? []
                plan.jobs.append(.list(v, ended: ended, changed: store.collectionsChanged.contains(v.name), changes: changes))
                if !ended && !changes.isEmpty { plan.renders = true }
            }
        }

        // Entities whose `entity` event some ids or feed subscription wants.
        if !idWatchers.isEmpty || !feeds.isEmpty {
            var wanted: Set<String> = []
            if !idWatchers.isEmpty {
                for id in change.valueChanged.union(change.deleted).union(change.forcedHolders) where idWatchers[id] != nil {
                    wanted.insert(id)
                }
            }
            if !feeds.isEmpty {
                wanted.formUnion(change.recordChanged)
                wanted.formUnion(change.deleted)
            }
            var entities: [(id: String, changed: Bool)] = []
            for id in wanted {
                let changed = store.valueBeforeMutation(id) != (store.entity(id) ?? .null)
                if changed || change.forcedHolders.contains(id) { entities.append((id, changed)) }
            }
            if entities.count > 1 { entities.sort { $0.id < $1.id } }
            for e in entities { plan.jobs.append(.entity(e.id, changed: e.changed)) }
            plan.renders = plan.renders || !entities.isEmpty
        }
        return plan
    }
}
