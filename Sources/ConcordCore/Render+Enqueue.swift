import ConcordJSON

extension Engine {
    /// Step three, serial: every job's bytes queued to its subscribers, and
    /// the view indexes updated, in the plan's order (PROTOCOL §6); query
    /// views last, after every other view of the mutation.
    func enqueueRender(_ plan: RenderPlan, _ results: RenderResults, change: StoreChange, seq: Int,
                       origins: Set<ObjectIdentifier>, context: JSON?) {
        var orderedFeeds: [SubscriptionRecord]?
        for (i, job) in plan.jobs.enumerated() {
            switch job {
            case .model(let view):
                guard case .model(let r) = results[i] else { continue }
                if r.ended {
                    endAll(view, seq: seq, context: context)
                    view.removeAll()
                    dropModelView(view)
                    continue
                }
                if let payload = r.payload {
                    send(payload, to: view, event: "update", seq: seq, changed: r.changed, origins: origins, context: context)
                } else if r.unsent, r.changed, let s = view.only, let p = s.pause {
                    noteChange(s, p, context: context)
                }
                if let newIDs = r.newIDs, newIDs != view.ids {
                    let oid = ObjectIdentifier(view)
                    for id in view.ids where !newIDs.contains(id) { removeWatcher(id, oid) }
                    for id in newIDs where !view.ids.contains(id) { modelWatchers[id, default: [:]][oid] = view }
                    view.ids = newIDs
                }
            case .key(let view, _, let ended, _):
                if ended {
                    endAll(view, seq: seq, context: context)
                    keyViews[view.key] = nil
                } else if case .payload(let payload, let changed) = results[i] {
                    send(payload, to: view, event: "update", seq: seq, changed: changed, origins: origins, context: context)
                }
            case .list(let view, let ended, _, _):
                if ended {
                    endAll(view, seq: seq, context: context)
                    view.removeAll()
                    collectionViews[view.name] = nil
                } else if case .payload(let payload, let changed) = results[i] {
                    send(payload, to: view, event: "collection", seq: seq, changed: changed, origins: origins, context: context)
                }
            case .entity(let id, _):
                guard case .payload(let payload, let changed) = results[i] else { continue }
                // One event for the entity's watchers and the feeds: the bytes
                // they share are written once, at the first that needs them.
                var shared: SharedEvent?
                if let only = idWatchers[id]?.only {
                    sendEntity(only, id, payload, seq: seq, changed: changed, origins: origins, context: context, shared: &shared, several: false)
                } else if let list = idWatchers[id]?.ordered() {
                    for s in list {
                        sendEntity(s, id, payload, seq: seq, changed: changed, origins: origins, context: context, shared: &shared, several: true)
                    }
                }
                if !feeds.isEmpty && (change.recordChanged.contains(id) || change.deleted.contains(id)) {
                    let type = Tree.type(of: id)
                    if orderedFeeds == nil { orderedFeeds = feeds.ordered() }
                    let several = orderedFeeds!.count > 1
                    for s in orderedFeeds! {
                        if case .feed(let types?) = s.kind, !types.contains(type) { continue }
                        sendEntity(s, id, payload, seq: seq, changed: changed, origins: origins, context: context, shared: &shared, several: several)
                    }
                }
            }
        }
        if !queries.types.isEmpty {
            sendQueryEvents(updateQueries(change), seq: seq, context: context)
            enforceQueryCap(seq: seq)
        }
    }
}
