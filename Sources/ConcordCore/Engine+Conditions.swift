import ConcordJSON
import ConcordProtocol

/// Conditional mutations and idempotency tokens (PROTOCOL.md §4.1).
extension Engine {
    /// The names a mutation writes, as the request gives them (not what is
    /// rewritten as a consequence): every entity object in its models and
    /// items (nested included), its key, its collection, what it deletes.
    struct WriteSet {
        var entities: [String] = []
        var keys: [String] = []
        var collections: [String] = []
    }

    func writeSet(_ m: Mutation) -> WriteSet {
        var w = WriteSet()
        func add(_ m: Mutation) {
            switch m {
            case .update(let model, let key, _, _):
                tree.identityList(model, into: &w.entities)
                if let key { w.keys.append(key) }
            case .deleteEntity(let id):
                w.entities.append(id)
            case .deleteKey(let key):
                w.keys.append(key)
            case .collectionSet(let name, let items), .collectionInsert(let name, _, let items):
                for item in items { tree.identityList(item, into: &w.entities) }
                w.collections.append(name)
            case .collectionRemoveAt(let name, _, _), .collectionRemoveIDs(let name, _), .collectionDelete(let name):
                w.collections.append(name)
            case .batch(let ops):
                for (op, _) in ops { add(op) }
            case .clear:
                break
            }
        }
        add(m)
        return w
    }

    /// Throws `conflict` when something `m` writes changed after seq `n`
    /// (`bad_request` when n is in the future). A `clear` writes everything.
    func checkUnchanged(_ m: Mutation, since n: Int) throws(ProtocolError) {
        if n > seq {
            throw ProtocolError(.badRequest, "if_unchanged_since \(n) is after the last applied seq \(seq)")
        }
        if case .clear = m {
            guard seq > n else { return }
            throw ProtocolError(.conflict, "clear: mutations were applied after seq \(n); nothing was applied",
                                details: [("seq", .int(seq)), ("conflicts", .object(JSONObject([
                                    .init(key: "entities", value: .array([])), .init(key: "keys", value: .array([])),
                                    .init(key: "collections", value: .array([])),
                                ])))])
        }
        let w = writeSet(m)
        var latest = 0
        var listed = 0
        var entities: [JSON] = [], keys: [JSON] = [], collections: [JSON] = []
        func note(_ s: Int, _ name: String, into list: inout [JSON]) {
            guard s > n else { return }
            latest = max(latest, s)
            if listed < 100 {
                list.append(.string(name))
                listed += 1
            }
        }
        // Repeats are rare and cheap to skip only where one conflicts.
        for id in w.entities {
            let s = versions.entity(id, present: store.entity(id) != nil)
            if s > n, !entities.contains(.string(id)) { note(s, id, into: &entities) }
        }
        var seen = Set<String>()
        seen = []
        for key in w.keys where seen.insert(key).inserted {
            note(versions.document(key, present: store.document(key) != nil), key, into: &keys)
        }
        seen = []
        for name in w.collections where seen.insert(name).inserted {
            note(versions.collection(name, present: store.collections[name] != nil), name, into: &collections)
        }
        guard latest > 0 else { return }
        let total = entities.count + keys.count + collections.count
        throw ProtocolError(.conflict, "\(total == 1 ? "one name it writes" : "\(total)\(listed >= 100 ? "+" : "") names it writes") changed after seq \(n) (the last at seq \(latest)); nothing was applied",
                            details: [("seq", .int(latest)), ("conflicts", .object(JSONObject([
                                .init(key: "entities", value: .array(entities)), .init(key: "keys", value: .array(keys)),
                                .init(key: "collections", value: .array(collections)),
                            ])))])
    }

    /// Answers a retried mutation whose token an accepted one carried:
    /// its seq, and `duplicate`. True when it did.
    func answerDuplicate(_ c: ClientSession, rid: JSON, token: String?) -> Bool {
        guard let token, let original = versions.tokens[token] else { return false }
        respond(c, rid: rid) { w in
            w.key("seq"); w.int(original)
            w.key("duplicate"); w.raw("true")
        }
        return true
    }

    /// After mutation `seq` was applied: what it changed, and its token.
    /// Returns the tokens that expired (to forget in the cache backend too).
    /// `written`: the identities the mutation's updates wrote, in order.
    func recordVersions(_ change: StoreChange, written: [String], ops: [(Mutation, origin: String?)], token: String?) -> [String] {
        // Keys and collection names by index (a loop over the pairs copied
        // each through the runtime's generic tuple witnesses), into sets
        // that hold their first member inline (no allocation for one op).
        var keys = IDSet()
        var lists = IDSet()
        for i in ops.indices {
            switch ops[i].0 {
            case .update(_, let key?, _, _): keys.insert(key)
            case .deleteKey(let key): keys.insert(key)
            case .collectionSet(let name, _), .collectionInsert(let name, _, _), .collectionRemoveAt(let name, _, _),
                 .collectionRemoveIDs(let name, _), .collectionDelete(let name):
                lists.insert(name)
            default: break
            }
        }
        versions.record(seq: seq, written: written, change: change, keys: keys, collections: lists,
                        collectionChanged: { self.store.collectionsChanged.contains($0) }, store: store)
        // The clock only when there are tokens to remember or expire.
        guard token != nil || versions.holdsTokens else { return [] }
        let now = versionsNow
        if let token { versions.remember(token: token, seq: seq, now: now) }
        return versions.expireTokens(seq: seq, now: now)
    }
}

/// `min_seq` (PROTOCOL.md §8.3) on a single server: a request waits for a
/// seq other connections' mutations have not reached yet.
extension Engine {
    func parkForSeq(_ c: ClientSession, _ line: ParsedLine, rid: JSON, minSeq: Int, deadline: Double) {
        c.waitingSeq = (minSeq, deadline, rid)
        c.backlog.insert(line, at: c.backlogHead)
        seqWaiters.append(c)
    }

    /// Whether requests wait for a seq (the driver then calls ``expireSeqWaits()`` now and then).
    public var hasSeqWaiters: Bool { !seqWaiters.isEmpty }

    /// Resumes the requests whose seq is reached.
    func wakeSeqWaiters() { serviceSeqWaiters(now: nil) }

    /// Also answers `unavailable` to the requests that waited past their timeout.
    public func expireSeqWaits() {
        guard !seqWaiters.isEmpty else { return }
        serviceSeqWaiters(now: clock())
    }

    /// Resumes the waiters whose seq is reached; with `now`, ends those past their deadline.
    private func serviceSeqWaiters(now: Double?) {
        let waiting = seqWaiters
        seqWaiters = []
        for c in waiting {
            guard clients[c.id] === c, let w = c.waitingSeq else { continue }
            if w.minSeq <= seq {
                c.waitingSeq = nil
                drain(c)
            } else if let now, now >= w.deadline || isShuttingDown {
                c.waitingSeq = nil
                _ = c.popBacklog()  // the line that waited
                respondError(c, rid: w.rid, isShuttingDown ? ProtocolError(.shuttingDown, "the server is shutting down")
                                 : ProtocolError(.unavailable, "seq \(w.minSeq) was not reached within the timeout (this server is at \(seq))"))
                drain(c)
            } else {
                seqWaiters.append(c)
            }
        }
    }
}
