import ConcordJSON
import ConcordProtocol

/// What the core remembers of the order of changes, for PROTOCOL.md §3.2 and
/// §4.1: the seq of the last change of every entity, document and
/// collection (a delete included), a bounded history of which entities each
/// recent mutation changed (feed replay), and the tokens of recent accepted
/// mutations (retries answered, not applied again).
///
/// "Changed" is the record: an entity, document or collection changes when
/// a mutation writes it (as the request gives it) to a different value, or
/// deletes it — not when it is rewritten as a consequence (a holder of a
/// changed entity). A view's "changed since" looks at every entity it
/// shows, so nothing it shows can change unnoticed. A deleted name keeps
/// its seq (a tombstone) for the history window; after that it reads as
/// never written. A record whose last change is not known — present before
/// this process started, or read back from the cache after it was evicted —
/// reads as changed at `floor` (the seq when that knowledge was lost), which
/// can only make a conditional write conflict, never let a stale one through.
final class Versions {
    /// Name → seq of its last change (present or deleted). `IDTable`s, the
    /// store's hash of identities: every update writes one or two of these.
    var entities = IDTable<Int>()
    var documents = IDTable<Int>()
    var collections = IDTable<Int>()
    /// Present records without an entry changed at this seq or before.
    var floor = 0
    /// Absent names without an entry: changed at this seq (a `clear`), else never.
    var clearedAt = 0

    /// Deletes, oldest first, so tombstones leave with the history window.
    private var tombstones: [(seq: Int, kind: UInt8, name: String)] = []
    private var tombstonesHead = 0

    /// Per recent mutation, the entities it changed (for `feed` with
    /// `since`): its seq and where its identities end in `historyIDs`
    /// (they start where the previous mutation's end). One flat list of
    /// identities, not a list per mutation: an update recorded no
    /// allocation of its own. Indices into `historyIDs` are absolute:
    /// `historyIDsBase` is how many were dropped from its front.
    private var history: [(seq: Int, end: Int)] = []
    private var historyHead = 0
    private var historyIDs: [String] = []
    private var historyIDsBase = 0
    /// Where the oldest kept mutation's identities start (absolute).
    private var historyStart = 0
    /// Entity names held by `history`.
    private(set) var historyEntities = 0
    /// Replay reaches back to seqs greater than this.
    private(set) var historyFloor = 0

    /// Token → the seq it was accepted with; in acceptance order for expiry.
    private(set) var tokens: [String: Int] = [:]
    private var tokenOrder: [(seq: Int, at: Double, token: String)] = []
    private var tokenHead = 0
    private(set) var tokenBytes = 0

    let historyMutations: Int
    let historyEntityLimit: Int
    let tokenRetention: Double
    let tokenByteLimit: Int

    init(historyMutations: Int, historyEntityLimit: Int, tokenRetention: Double, tokenByteLimit: Int) {
        self.historyMutations = historyMutations
        self.historyEntityLimit = historyEntityLimit
        self.tokenRetention = tokenRetention
        self.tokenByteLimit = tokenByteLimit
    }

    // MARK: Reading

    func entity(_ id: String, present: Bool) -> Int { entities[id] ?? (present ? floor : clearedAt) }
    func document(_ key: String, present: Bool) -> Int { documents[key] ?? (present ? floor : clearedAt) }
    func collection(_ name: String, present: Bool) -> Int { collections[name] ?? (present ? floor : clearedAt) }

    // MARK: Recording

    /// Notes what mutation `seq` changed (after it was applied): the
    /// entities it wrote whose value changed, what it deleted (cascades
    /// included), the keys and collections it wrote that changed.
    func record(seq: Int, written: some Sequence<String>, change: StoreChange, keys: some Sequence<String>, collections written_: some Sequence<String>,
                collectionChanged: (String) -> Bool, store: Store) {
        let before = historyIDs.count
        // One hash per name: the old seq comes back from the write.
        let hashed = change.valueChanged.hashed(forLookups: written.underestimatedCount)
        for id in written where hashed?.contains(id) ?? change.valueChanged.contains(id) {
            if entities.updateValue(seq, forKey: id) != seq { historyIDs.append(id) }
        }
        for id in change.deleted where entities.updateValue(seq, forKey: id) != seq {
            historyIDs.append(id)
            if store.entity(id) == nil { tombstones.append((seq, 0, id)) }
        }
        for key in keys where change.documentsChanged.contains(key) { documents[key] = seq }
        for key in change.documentsDeleted {
            documents[key] = seq
            if store.document(key) == nil { tombstones.append((seq, 1, key)) }
        }
        for name in written_ where collectionChanged(name) { collections[name] = seq }
        for name in change.collectionsDeleted {
            collections[name] = seq
            if store.collections[name] == nil { tombstones.append((seq, 2, name)) }
        }
        if historyIDs.count > before {
            history.append((seq, historyIDsBase + historyIDs.count))
            historyEntities += historyIDs.count - before
        }
        trim(seq: seq)
    }

    /// Whether some token is still remembered (else `expireTokens` has nothing to do).
    var holdsTokens: Bool { tokenHead < tokenOrder.count }

    /// Remembers an accepted mutation's token.
    func remember(token: String, seq: Int, now: Double) {
        tokens[token] = seq
        tokenOrder.append((seq, now, token))
        tokenBytes += token.utf8.count + 64
    }

    /// Expires tokens older than both windows (the last `historyMutations`
    /// mutations and `tokenRetention` seconds), or the oldest beyond the byte limit.
    /// Returns the tokens forgotten (the cache backend forgets them too).
    @discardableResult
    func expireTokens(seq: Int, now: Double) -> [String] {
        var expired: [String] = []
        while tokenHead < tokenOrder.count {
            let t = tokenOrder[tokenHead]
            let old = t.seq <= seq - historyMutations && t.at < now - tokenRetention
            guard old || tokenBytes > tokenByteLimit else { break }
            if tokens[t.token] == t.seq {
                tokens[t.token] = nil
                expired.append(t.token)
            }
            tokenBytes -= t.token.utf8.count + 64
            tokenHead += 1
        }
        if tokenHead > 1024 && tokenHead * 2 > tokenOrder.count {
            tokenOrder.removeFirst(tokenHead)
            tokenHead = 0
        }
        return expired
    }

    /// Drops history past its bounds, and tombstones older than the history window.
    private func trim(seq: Int) {
        while historyHead < history.count,
              history[historyHead].seq <= seq - historyMutations || historyEntities > historyEntityLimit {
            historyFloor = history[historyHead].seq
            historyEntities -= history[historyHead].end - historyStart
            historyStart = history[historyHead].end
            historyHead += 1
        }
        if historyHead > 1024 && historyHead * 2 > history.count {
            history.removeFirst(historyHead)
            historyHead = 0
        }
        // The identities of dropped mutations go in the same amortized way.
        let dropped = historyStart - historyIDsBase
        if dropped > 1024 && dropped * 2 > historyIDs.count {
            historyIDs.removeFirst(dropped)
            historyIDsBase = historyStart
        }
        while tombstonesHead < tombstones.count, tombstones[tombstonesHead].seq <= seq - historyMutations {
            let t = tombstones[tombstonesHead]
            switch t.kind {
            case 0: if entities[t.name] == t.seq { entities[t.name] = nil }
            case 1: if documents[t.name] == t.seq { documents[t.name] = nil }
            default: if collections[t.name] == t.seq { collections[t.name] = nil }
            }
            tombstonesHead += 1
        }
        if tombstonesHead > 1024 && tombstonesHead * 2 > tombstones.count {
            tombstones.removeFirst(tombstonesHead)
            tombstonesHead = 0
        }
    }

    /// The entities changed after `since` (each once, with its last seq, in
    /// seq order), or nil when the history no longer reaches back that far.
    func changed(after since: Int) -> [(id: String, seq: Int)]? {
        guard since >= historyFloor else { return nil }
        var last: [String: Int] = [:]
        var order: [String] = []
        // Newest first finds each entity's last change once.
        var i = history.count - 1
        while i >= historyHead, history[i].seq > since {
            let start = i > historyHead ? history[i - 1].end : historyStart
            for k in (start - historyIDsBase) ..< (history[i].end - historyIDsBase) where last[historyIDs[k]] == nil {
                last[historyIDs[k]] = history[i].seq
                order.append(historyIDs[k])
            }
            i -= 1
        }
        return order.map { ($0, last[$0]!) }.sorted { $0.seq != $1.seq ? $0.seq < $1.seq : QueryEval.compareStrings($0.id, $1.id) < 0 }
    }

    /// A record's seq is no longer known (evicted from memory).
    func forget(entity id: String, seq: Int) {
        if entities.removeValue(forKey: id) != nil { floor = max(floor, seq) }
    }

    func forget(document key: String, seq: Int) {
        if documents.removeValue(forKey: key) != nil { floor = max(floor, seq) }
    }

    func forget(collection name: String, seq: Int) {
        if collections.removeValue(forKey: name) != nil { floor = max(floor, seq) }
    }

    /// Everything was removed by `clear` at `seq`.
    func cleared(seq: Int) {
        entities = [:]
        documents = [:]
        collections = [:]
        tombstones = []
        tombstonesHead = 0
        clearedAt = seq
        floor = seq
    }

    // MARK: Snapshots (cluster mode)

    var tombstoneList: ArraySlice<(seq: Int, kind: UInt8, name: String)> { tombstones[tombstonesHead...] }
    var tokenList: ArraySlice<(seq: Int, at: Double, token: String)> { tokenOrder[tokenHead...] }

    func replaceTombstones(_ t: [(seq: Int, kind: UInt8, name: String)]) {
        tombstones = t
        tombstonesHead = 0
    }

    /// Loaded from a snapshot at `seq`: no history before it (a replay from earlier is `truncated`).
    func markHistoryLost(at seq: Int) {
        history = []
        historyHead = 0
        historyIDs = []
        historyIDsBase = 0
        historyStart = 0
        historyEntities = 0
        historyFloor = seq
    }

    /// Mutations the history holds (with entity changes).
    var historyMutationsHeld: Int { history.count - historyHead }
    /// Names with a known last change (live and tombstones).
    var namesHeld: Int { entities.count + documents.count + collections.count }

    /// Approximate bytes held (stats).
    var approximateBytes: Int {
        (entities.count + documents.count + collections.count) * 48 + historyEntities * 24 + (history.count - historyHead) * 32 + tokenBytes
    }
}
