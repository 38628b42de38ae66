import ConcordJSON
public import ConcordProtocol
import Synchronization

/// Rebuilding a running host after the log lost entries (PROTOCOL.md §8.5).
///
/// The host that finds the log does not continue what it applied (a gap, a
/// broken hash chain, a new epoch, a head that went back) stops applying and
/// rebuilds from what the log now holds: a **shadow** engine loads the
/// newest snapshot (or starts empty when there is none) and applies the log
/// after it, while the host keeps serving reads and subscriptions from its
/// old state and answers mutations `unavailable`. The host appends a
/// **rebase** entry carrying its seq + 1; applying a rebase (on every host, in
/// log order) sets `seq = max(seq, carried)`, so no host's numbers go
/// backwards and every host numbers the following mutations alike. When the
/// shadow has applied this host's own rebase, the host takes the shadow's
/// state: the difference is applied as one batch with every connection's
/// events held back, and each view then gets one event marked
/// `"coalesced":true` from the value it was last sent to the current one
/// (or `delete` if its root is gone), with the seq the host has reached.
extension Engine {
    /// The line of a rebase entry (not a request: no client can send it, since
    /// only decoded requests are appended).
    static func rebaseLine(seq: Int) -> [UInt8] { Array("{\"op\":\"_rebase\",\"seq\":\(seq)}".utf8) }

    static func rebaseSeq(_ line: [UInt8]) -> Int? {
        let prefix = Array("{\"op\":\"_rebase\",\"seq\":".utf8)
        guard line.count > prefix.count + 1, line.starts(with: prefix), line.last == UInt8(ascii: "}") else { return nil }
        return Int(String(decoding: line[prefix.count..<(line.count - 1)], as: UTF8.self))
    }

    /// True once when the host stopped following the log and wants its truth
    /// (the driver then calls ``beginClusterResync(from:)``).
    public func takeClusterResyncWanted() -> Bool {
        guard let cl = cluster, cl.broken != nil, cl.shadow == nil, !cl.resyncRequested else { return false }
        cl.resyncRequested = true
        return true
    }

    /// The log's truth to rebuild from: its newest snapshot, or nil when it
    /// holds none (the log then starts at offset 1). Entries after it follow
    /// through ``applyClusterEntry(_:)``.
    public func beginClusterResync(from snapshot: ClusterSnapshot?) throws(ProtocolError) {
        guard let cl = cluster, cl.broken != nil, cl.shadow == nil else { return }
        let shadow = Engine(configuration: configuration)
        shadow.clock = clock
        shadow.enableCluster(ClusterSettings(name: cl.settings.name, host: cl.settings.host, origin: cl.settings.origin + "#shadow",
                                             timeout: cl.settings.timeout))
        if let snapshot { try shadow.loadClusterSnapshot(snapshot) }
        shadow.clusterEvent(.attached(epoch: "", head: 0))
        // This host's mutations the log still holds are applied by the shadow: their answers come back with it.
        shadow.cluster?.captureOrigin = cl.settings.origin
        cl.shadow = shadow
        let ref = cl.nextRef
        cl.nextRef += 1
        cl.rebaseRef = ref
        // One past what this host numbered: the rebuilt state is a new version,
        // so no view ever gets two different values under one seq.
        cl.appends.append((ref, Self.rebaseLine(seq: seq + 1)))
    }

    /// An entry while resyncing: to the shadow; when it carries this host's
    /// rebase, the host takes the shadow's state.
    func applyToShadow(_ entry: ClusterEntry, _ cl: ClusterState, _ shadow: Engine) -> Bool {
        guard shadow.applyClusterEntry(entry) else {
            // The truth moved again under the rebuild: start over from the log's newest state.
            cl.shadow = nil
            cl.rebaseRef = nil
            cl.resyncRequested = false
            return false
        }
        if entry.origin == cl.settings.origin, let ref = cl.rebaseRef, entry.mutations.contains(where: { $0.ref == ref }) {
            takeShadowState(shadow, cl)
        }
        return true
    }

    /// The host's state becomes the shadow's, and every view is told once.
    private func takeShadowState(_ shadow: Engine, _ cl: ClusterState) {
        // Every connection's events are held back from what it was last sent.
        var began: [ClientSession] = []
        for c in clients.values where c.coalescing == 0 {
            beginCoalescing(c)
            began.append(c)
        }
        var updates: [(Mutation, origin: String?)] = []
        var deletes: [(Mutation, origin: String?)] = []
        for (id, _) in shadow.store.entities {
            let v = shadow.store.entity(id)!
            if store.entity(id) != v { updates.append((.update(model: v, key: nil, mode: .replace, force: false), nil)) }
        }
        for (key, _) in shadow.store.documents {
            let v = shadow.store.document(key)!
            if store.document(key) != v { updates.append((.update(model: v, key: key, mode: .replace, force: false), nil)) }
        }
        for (name, _) in shadow.store.collections {
            let items = shadow.store.collectionItems(name)
            if store.collections[name] == nil || store.collectionItems(name) != items { updates.append((.collectionSet(name: name, items: items), nil)) }
        }
        for key in store.documents.keys where shadow.store.documents[key] == nil { deletes.append((.deleteKey(key), nil)) }
        for name in store.collections.keys where shadow.store.collections[name] == nil { deletes.append((.collectionDelete(name: name), nil)) }
        for id in store.entities.keys where shadow.store.entities[id] == nil { deletes.append((.deleteEntity(id), nil)) }
        var lists = shadow.store.requiredLists
        for (type, _) in store.requiredLists where !lists.contains(where: { $0.type == type }) { lists.append((type, [])) }
        store.setSchema(lists)
        // Sorted: the batch, like everything the core does, must not depend on hashing order.
        func name(_ m: Mutation) -> String {
            switch m {
            case .update(let v, let key, _, _): return (key.map { "d" + $0 } ?? "e" + (v.identity(idKey: configuration.idKey) ?? ""))
            case .deleteEntity(let id): return "e" + id
            case .deleteKey(let key): return "d" + key
            case .collectionSet(let n, _), .collectionDelete(let n): return "c" + n
            default: return ""
            }
        }
        let ops = updates.sorted { name($0.0) < name($1.0) } + deletes.sorted { name($0.0) < name($1.0) }
        if !ops.isEmpty {
            do throws(ProtocolError) {
                try mutate(cl.sink, rid: .null, .batch(ops), MutationOptions(), fromLog: true)
            } catch {
                // The shadow's state is one the store accepted: this would be a bug. Say so, loudly.
                cl.broken = "rebuilding from the log failed: \(error.message)"
                cl.sink.output = OutputQueue()
                return
            }
            cl.sink.output = OutputQueue()
        }
        // Numbers, versions and the log position are the shadow's (it applied the rebases).
        seq = shadow.seq
        versions = shadow.versions
        if let sc = shadow.cluster {
            cl.appliedOffset = sc.appliedOffset
            cl.lastHash = sc.lastHash
            cl.lastStreamID = sc.lastStreamID
            cl.epoch = sc.epoch
            cl.headOffset = max(sc.headOffset, sc.appliedOffset)
            cl.recentHashes = sc.recentHashes
        }
        cl.shadow = nil
        cl.rebaseRef = nil
        cl.resyncRequested = false
        cl.broken = nil
        cl.resyncs += 1
        cl.link = .attached
        // One event per changed view, with the seq reached; then events flow again.
        for c in clients.values { flushCoalesced(c) }
        // This host's mutations that the log kept were applied in the rebuild: their answers, in order.
        var answered: [ClientSession] = []
        for (ref, bytes) in shadow.cluster?.captured ?? [] {
            guard let p = cl.pending.removeValue(forKey: ref), clients[p.client.id] === p.client, !bytes.isEmpty else { continue }
            // Older mutations of the connection that the log did not keep come first.
            answerOlderLogPending(p.client, before: ref, cl)
            p.client.output.append(bytes)
            responsesQueued += 1
            markDirty(p.client)
            popLogPending(p.client, ref)
            if !answered.contains(where: { $0 === p.client }) { answered.append(p.client) }
        }
        for c in began where clients[c.id] === c {
            c.coalescing = 0
            c.flow.coalescing.store(0, ordering: .relaxed)
            for s in c.subs.values {
                guard let p = s.pause, p.byCongestion else { continue }
                if p.byUser { p.byCongestion = false } else { s.pause = nil }
            }
        }
        for c in answered { drain(c) }
        if !seqWaiters.isEmpty { wakeSeqWaiters() }
        if !cl.syncWaiters.isEmpty { serviceSyncWaiters(now: nil) }
        checkInvariantsIfEnabled()
    }
}
