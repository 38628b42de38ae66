import CConcordPrefetch
import ConcordJSON
import ConcordProtocol

/// One entity's current version.
///
/// `value` is materialized: nested entities appear with their own current
/// version, shared copy-on-write with their records, so reading an entity or
/// a document never walks the graph. `children`/`referrers` are the
/// normalized structure: who this record references directly, and who
/// references it. When a child changes, each referrer is re-materialized by
/// substituting its top-most nested entities (cost: the referrer's own size).
final class EntityRecord {
    // The fields are in this order for size: the one-byte and four-byte
    // ones fill the tail of `value` (17 bytes), so a record is 64 bytes
    // (jemalloc's class; 80 with them after the 8-byte ones).
    var value: JSON
    var walkState: WalkState = .none
    /// Whether the referrer indexes hold this record's identity (`heldByEntities`,
    /// `heldByDocuments`): propagation skips the lookups for a record nobody
    /// holds (an author's hundred posts, each refreshed, held by nothing).
    var held: UInt8 = 0
    /// Whether `Store.entities` holds this record (a record removed, or
    /// replaced, within a mutation may still be listed in its journal lists).
    var resident = false
    /// Where the running mutation's journal keeps this record's value from
    /// before it (valid while `mutationMark` is of the running mutation).
    var journalIndex: Int32 = 0
    var children: Children
    /// Which propagation last visited this record (`Store.walkGeneration`)
    /// and how far: marks instead of `Set<String>`s of identities, so a
    /// referrer's refresh hashes no identity to know whether it was seen.
    var walkGeneration: UInt64 = 0
    /// What the running mutation did to this record: `Store.mutationGeneration`
    /// shifted left by 3, with `written` / `substituted` / `reshaped` in the
    /// low bits (stale when the generation differs).
    var mutationMark: UInt64 = 0

    enum WalkState: UInt8 {
        case none, pending, inProgress, done
    }

    static let heldByEntities: UInt8 = 1
    static let heldByDocuments: UInt8 = 2

    static let written: UInt64 = 1
    static let substituted: UInt64 = 2
    /// Written with a value not known to nest within the stored-depth bound
    /// (a merge that gives an object or array, repeated identities resolved,
    /// a pruning, a restore, a load): only a record written without it is
    /// known to, being a subtree of the request as it came (the parser
    /// bounded the request's depth) or its stored value with scalar members
    /// merged in (stored values are within the bound).
    static let reshaped: UInt64 = 4
    /// Written with other nested entities than it held before the mutation
    /// (or made anew in it: what it held before is not known here).
    static let childrenChanged: UInt64 = 8
    /// Refreshed by substitution, in place, and journaled without its
    /// value from before the mutation: that value is this one with each
    /// nested entity's value from before substituted
    /// (`Store.valueBeforeMutation`). Cleared when the value is kept after
    /// all (the record written or removed later in the mutation).
    static let beforeNotKept: UInt64 = 16
    static let markBits = 5
    static let markMask: UInt64 = (1 << markBits) - 1

    init(value: JSON, children: Children) {
        self.value = value
        self.children = children
    }
}

extension EntityRecord {
    /// Where `value` lies in the object: after the 16-byte object header,
    /// the first stored property (checked by `PrefetchLayoutTests.aRecordsValueIsWhereThePrefetchLooks`).
    static let valueOffset = 16

    /// Asks for the lines of the record at `address` (80 bytes: two lines
    /// where it straddles one) without touching it: no retain, no read.
    @inline(__always) static func prefetchRecord(at address: UInt) {
        guard let p = UnsafeRawPointer(bitPattern: address) else { return }
        concord_prefetch(p)
        concord_prefetch(p + 64)
    }

    /// The address of the value's member list when the value is an object
    /// (an object's payload is its `[Member]`: one pointer, in the value's
    /// first word), read as a word: no retain, nothing else read. Another
    /// kind of value gives a word that is not a list's address; the
    /// prefetch below is a hint, and a hint at any address is harmless.
    @inline(__always) static func valueStorageWord(ofRecordAt address: UInt) -> UInt {
        UnsafeRawPointer(bitPattern: address)!.load(fromByteOffset: valueOffset, as: UInt.self)
    }

    /// Asks for the first three lines of the member list of the record at
    /// `address` (a post's four members and the list's header): the
    /// record's own lines must be in cache already, or this read waits for them.
    @inline(__always) static func prefetchValue(ofRecordAt address: UInt) {
        let w = valueStorageWord(ofRecordAt: address)
        // Only what looks like a heap address (user space, word-aligned).
        guard w & 7 == 0, w > 4096, w < (1 << 47), let p = UnsafeRawPointer(bitPattern: w) else { return }
        concord_prefetch(p)
        concord_prefetch(p + 64)
        concord_prefetch(p + 128)
    }
}

/// A document stored under a cache key: a tree whose top-most entities are references.
final class DocumentRecord {
    var value: JSON
    var children: Children
    /// The mutation generation that journaled this key (`Store.mutationGeneration`),
    /// and where its entry is in `Store.documentJournal` (valid while that generation runs).
    var journalMark: UInt64 = 0
    var journalIndex: Int32 = 0
    /// Set by the update that last wrote this document when the document
    /// is, before and after, its root entity's stored value and changed
    /// with it (`Store.rootOfDocument`). Read only while `journalMark` is
    /// the running mutation's (every write clears it).
    var followsRoot = false

    init(value: JSON, children: Children) {
        self.value = value
        self.children = children
    }
}

/// What one store operation did, for the views.
struct StoreChange {
    /// Entities whose materialized value changed (an own write or a nested change).
    var valueChanged = ChangeSet()
    /// Entities whose own record was written with a change, deleted, or forced: the feed.
    var recordChanged = IDSet()
    /// Documents whose value changed (or was forced).
    var documentsChanged = IDSet()
    /// The sets an update rarely fills, in one box made at the first
    /// write to one of them: an update's change set is then three sets,
    /// destroyed with one more test (the eight inline cost ~260
    /// instructions an update to destroy, most of them empty).
    private var rare: Rare? = nil

    private final class Rare {
        var deleted = IDSet()
        var forcedHolders = IDSet()
        var documentsDeleted = IDSet()
        var documentsForced = IDSet()
        var collectionsDeleted = IDSet()

        func copy() -> Rare {
            let r = Rare()
            r.deleted = deleted
            r.forcedHolders = forcedHolders
            r.documentsDeleted = documentsDeleted
            r.documentsForced = documentsForced
            r.collectionsDeleted = collectionsDeleted
            return r
        }
    }

    /// The box, made or unshared, for a write (a copied change set shares
    /// it until then). The sets below are read from it, or read as empty,
    /// and written in place through it (`_modify`: an assignment too).
    private mutating func rareForWriting() -> Rare {
        if rare == nil {
            rare = Rare()
        } else if !isKnownUniquelyReferenced(&rare!) {
            rare = rare!.copy()
        }
        return rare!
    }

    /// Entities deleted (cascades included).
    var deleted: IDSet {
        get { rare?.deleted ?? IDSet() }
        _modify { yield &rareForWriting().deleted }
    }
    /// Entities forced, plus every entity holding one.
    var forcedHolders: IDSet {
        get { rare?.forcedHolders ?? IDSet() }
        _modify { yield &rareForWriting().forcedHolders }
    }
    /// Documents removed.
    var documentsDeleted: IDSet {
        get { rare?.documentsDeleted ?? IDSet() }
        _modify { yield &rareForWriting().documentsDeleted }
    }
    /// Documents that hold a forced entity (told even when unchanged).
    var documentsForced: IDSet {
        get { rare?.documentsForced ?? IDSet() }
        _modify { yield &rareForWriting().documentsForced }
    }
    /// Collections dropped (`collection.delete`).
    var collectionsDeleted: IDSet {
        get { rare?.collectionsDeleted ?? IDSet() }
        _modify { yield &rareForWriting().collectionsDeleted }
    }

    mutating func formUnion(_ o: StoreChange) {
        valueChanged.formUnion(o.valueChanged)
        recordChanged.formUnion(o.recordChanged)
        documentsChanged.formUnion(o.documentsChanged)
        guard let r = o.rare else { return }
        deleted.formUnion(r.deleted)
        forcedHolders.formUnion(r.forcedHolders)
        documentsDeleted.formUnion(r.documentsDeleted)
        documentsForced.formUnion(r.documentsForced)
        collectionsDeleted.formUnion(r.collectionsDeleted)
    }
}

/// The normalized in-memory store: entities by identity, documents by key,
/// the schema. Deterministic and single-threaded; the engine owns it.
final class Store {
    let tree: Tree
    /// The records by identity: the interning table the live queries
    /// share (``Identities``), so an entity's text and hash are kept once.
    /// Only the store writes records into it.
    let entities = Identities()
    private(set) var documents = IDTable<DocumentRecord>()
    /// Entity → the entities that reference it directly, each with its
    /// record and how often (propagation reaches a holder's record without
    /// looking it up). Kept apart from the records: a reference may precede
    /// its target. Holders are resident (the index is kept from resident
    /// records' children).
    private var referrers = IDTable<Holders<Holding>>()

    /// A holder in `referrers`.
    struct Holding {
        let record: EntityRecord
        var count: Int
    }
    /// Entity → the documents that hold it as a top-most entity.
    private var documentReferrers = IDTable<Holders<Int>>()
    /// Ordered collections of entity references (Store+Collections.swift).
    var collections: [String: CollectionRecord] = [:]
    /// Entity → the collections holding it, with occurrence counts.
    var collectionReferrers: [String: [String: Int]] = [:]
    /// How to undo the running mutation's collection edits, in order. An undo
    /// log rather than first-touch copies: copying a 100k-item list to edit
    /// one index would make every edit O(n).
    var collectionUndo: [CollectionUndo] = []
    /// Whether `StoreChange.recordChanged` is needed (there are feed subscriptions).
    var trackRecordChanges = true
    /// Collections the running mutation created, edited or dropped.
    var touchedCollections: Set<String> = []
    /// The running mutation's changes per collection, in order.
    var collectionChanges: [String: [CollectionStep]] = [:]
    /// Collections whose list really changed in the running mutation (not only forced rewrites).
    var collectionsChanged: Set<String> = []
    /// Required members per type, and the order types were first declared in.
    private(set) var required: [String: Set<String>] = [:]
    private(set) var requiredLists: [(type: String, members: [String])] = []

    /// First-touch values of the running mutation: what each entity and
    /// document was before it (nil: absent). Rollback restores them; views
    /// use them as "the value before" for paused subscriptions.
    ///
    /// Entities: one entry per identity, in first-touch order. A resident
    /// record finds its entry by `journalIndex` (no hashing: a refresh of a
    /// hundred posts journals each with an append); an identity with no
    /// resident record (absent when first touched, or removed since) by
    /// `journaledAbsent`.
    private(set) var entityJournal: [(id: String, old: JSON?)] = []
    private var journaledAbsent: [String: Int] = [:]
    /// Documents: likewise one entry per key, in first-touch order; a
    /// resident record finds its entry by `journalIndex`, a key with none by
    /// `journaledAbsentDocuments`.
    private(set) var documentJournal: [(key: String, old: JSON?)] = []
    private var journaledAbsentDocuments: [String: Int] = [:]

    init(idKey: String) {
        tree = Tree(idKey: idKey)
    }

    /// Bumped when a mutation ends (commit or rollback): records' `mutationMark`s
    /// of another generation are stale.
    private var mutationGeneration: UInt64 = 1

    @inline(__always)
    private func markMutation(_ rec: EntityRecord, _ what: UInt64) {
        let base = mutationGeneration << EntityRecord.markBits
        rec.mutationMark = (rec.mutationMark & ~EntityRecord.markMask) == base ? rec.mutationMark | what : base | what
    }

    /// The identity of `value`'s root when that is an entity the running
    /// mutation wrote, holding the same entities as before it, none of
    /// which changed (`valueChanged`: the mutation's; a change below a
    /// child makes the child change too). A document that is this entity
    /// before and after then changed exactly it: the same identities, each
    /// other one with its value (no walk of the two trees to find out).
    func soleChangedEntity(_ value: JSON, valueChanged: ChangeSet) -> String? {
        guard case .object(let o) = value, let id = o.identity(idKey: tree.idKey), let rec = entities[id],
              isSoleChange(rec, valueChanged: valueChanged) else { return nil }
        return id
    }

    /// Whether the running mutation wrote `rec` and changed none of the
    /// entities it holds (`soleChangedEntity`'s test, for a caller that
    /// has the record: `root(following:)`).
    func isSoleChange(_ rec: EntityRecord, valueChanged: ChangeSet) -> Bool {
        let mark = rec.mutationMark
        guard mark >> EntityRecord.markBits == mutationGeneration, mark & EntityRecord.written != 0,
              mark & EntityRecord.childrenChanged == 0 else { return false }
        return !rec.children.containsID { valueChanged.contains($0) }
    }

    /// The value of a record when the stored-depth check has to walk it;
    /// nil when it is known to be within the bound without a walk: written
    /// only with a subtree of its request as it came (the parser bounded the
    /// request's depth, and the model sits at least one level inside it),
    /// or with scalars merged into its stored value (see `reshaped`).
    func valueForDepthCheck(_ rec: EntityRecord) -> JSON? {
        rec.mutationMark & ~EntityRecord.childrenChanged == mutationGeneration << EntityRecord.markBits | EntityRecord.written ? nil : rec.value
    }

    /// `valueForDepthCheck` of the record under `id` (nil: absent).
    func valueForDepthCheck(_ id: String) -> JSON? {
        entities[id].flatMap { valueForDepthCheck($0) }
    }

    /// Whether some entity written by the running mutation, and held by
    /// another, now nests deeper than before it: when none does, no entity
    /// refreshed by substitution nests deeper than before either (it holds
    /// its children's new versions where it held their old ones), so the
    /// stored-depth check can skip them.
    /// `limit`: the stored-depth bound (heights are compared up to one above it).
    func aHeldEntityNestsDeeper(limit: Int) -> Bool {
        for (_, rec) in writtenInMutation where rec.held & EntityRecord.heldByEntities != 0 && rec.resident {
            if rec.value.height(cappedAt: limit + 1) > valueBeforeMutation(rec).height(cappedAt: limit + 1) { return true }
        }
        return false
    }

    /// The records the running mutation wrote (not only refreshed), each
    /// once, in order; a record removed afterwards is still listed (check
    /// `isResident`).
    private(set) var writtenInMutation: [(id: String, record: EntityRecord)] = []

    /// Whether `rec` is resident (in `entities`) — the records a mutation
    /// listed may have been removed since.
    func isResident(_ rec: EntityRecord) -> Bool { rec.resident }

    /// Forgets the journal: the running mutation is committed.
    func commit() {
        mutationGeneration &+= 1
        rootOfDocument = nil
        if beforeCheck != nil { beforeCheck = ([:], [:]) }
        writtenInMutation.drain()
        // Drained, not `removeAll`: see `Array.drain()` (a rename frees a
        // hundred entries here).
        entityJournal.drain()
        if !journaledAbsent.isEmpty { journaledAbsent.removeAll(keepingCapacity: true) }
        documentJournal.drain()
        if !journaledAbsentDocuments.isEmpty { journaledAbsentDocuments.removeAll(keepingCapacity: true) }
        if !collectionUndo.isEmpty { collectionUndo.removeAll(keepingCapacity: true) }
        if !collectionChanges.isEmpty { collectionChanges.removeAll(keepingCapacity: true) }
        if !collectionsChanged.isEmpty { collectionsChanged.removeAll(keepingCapacity: true) }
        if !touchedCollections.isEmpty { touchedCollections.removeAll(keepingCapacity: true) }
    }

    /// Undoes everything since the last `commit`.
    func rollback() {
        rootOfDocument = nil
        // Values refreshed in place are reconstructed while every entry is
        // as the mutation left it, before anything is restored.
        for (id, old) in entityJournal where old == nil {
            if let rec = entities[id] { keepBefore(rec) }
        }
        let ents = entityJournal
        let docs = documentJournal
        undoCollections()
        for (key, old) in docs { setDocument(key, old) }
        for (id, old) in ents {
            if let old { setEntity(id, old) } else { removeEntity(id) }
        }
        commit()
    }

    /// The value an entity had before the running mutation (null: absent).
    func valueBeforeMutation(_ id: String) -> JSON {
        if let rec = entities[id] { return valueBeforeMutation(rec) }
        if let i = journaledAbsent[id] { return entityJournal[i].old ?? .null }
        return .null
    }

    /// `valueBeforeMutation` of a resident record.
    func valueBeforeMutation(_ rec: EntityRecord) -> JSON {
        guard touchedInThisMutation(rec) else { return rec.value }
        if rec.mutationMark & EntityRecord.beforeNotKept != 0 { return reconstructedBefore(rec) }
        return entityJournal[Int(rec.journalIndex)].old ?? .null
    }

    /// The value before the mutation of a record refreshed in place
    /// (`EntityRecord.beforeNotKept`): its own members are as they were
    /// (only its nested entities changed), and each nested entity held,
    /// before, its own value from before (values are materialized), which
    /// was known when the record was refreshed (`childrenBeforeKnown`).
    private func reconstructedBefore(_ rec: EntityRecord) -> JSON {
        let before = tree.substituteNested(rec.value) { c in
            let v = self.valueBeforeMutation(c)
            return v == .null ? nil : v
        }
        if let check = beforeCheck, let id = check.ids[ObjectIdentifier(rec)] {
            precondition(before == check.values[id], "internal check: the value before the mutation of '\(id)' is not what the record held")
        }
        return before
    }

    /// Live queries read two things of a changed entity's value from before
    /// the mutation: whether it is the current value, and the value at a
    /// path. For a record refreshed in place (`beforeNotKept`: its own
    /// members as they were, its nested entities changed) a `BeforeReader`
    /// answers both without building that value — `reconstructedBefore`
    /// copied the record's members with each nested entity's value from
    /// before, for each of an author's hundred posts. One reader per
    /// pass over a mutation's changes: it keeps the last nested entity's
    /// value from before (siblings share their child).
    struct BeforeReader {
        unowned(unsafe) let store: Store
        private var lastChild = ""
        private var lastChildBefore: JSON = .null
        private var lastChildUnchanged = false

        init(_ store: Store) { self.store = store }

        /// Whether `rec` was refreshed in place in this mutation (then the
        /// two methods below apply).
        func refreshedInPlace(_ rec: EntityRecord) -> Bool {
            store.touchedInThisMutation(rec) && rec.mutationMark & EntityRecord.beforeNotKept != 0
        }

        /// The value from before of a nested entity (`.null`: it had none,
        /// and the record keeps its current value there).
        private mutating func childBefore(_ c: String) -> JSON {
            if c != lastChild {
                lastChild = c
                lastChildBefore = store.valueBeforeMutation(c)
                lastChildUnchanged = lastChildBefore == .null || lastChildBefore == (store.entities[c]?.value ?? .null)
            }
            return lastChildBefore
        }

        /// Whether the value from before of a record refreshed in place is
        /// its current value: `reconstructedBefore` substitutes each nested
        /// entity's value from before and nothing else, and the record holds
        /// each one's current value, so the two are equal exactly when every
        /// nested entity's are.
        mutating func isUnchanged(_ rec: EntityRecord) -> Bool {
            for c in rec.children.keys {
                _ = childBefore(c)
                if !lastChildUnchanged { return false }
            }
            return true
        }

        /// `QueryEval.value(valueBeforeMutation(rec), path)` of a record
        /// refreshed in place: the walk reads the current value, and the
        /// first entity it meets on the way (a nested one: not the record)
        /// is read as it was before; a container it ends at has its nested
        /// entities read so.
        mutating func value(of rec: EntityRecord, at path: QueryPath) -> JSON? {
            var cur = rec.value
            var substituted = false
            for name in path {
                guard case .object(let o) = cur, let next = o[name] else { return nil }
                cur = next
                if !substituted, case .object(let e) = cur, let c = e.identity(idKey: store.tree.idKey) {
                    let b = childBefore(c)
                    if b != .null { cur = b }
                    substituted = true
                }
            }
            if !substituted && cur.isContainer {
                cur = store.tree.substituteNested(cur) { c in
                    let b = self.store.valueBeforeMutation(c)
                    return b == .null ? nil : b
                }
            }
            return cur
        }
    }

    /// Keeps the value before the mutation of a record refreshed in place,
    /// before the record itself changes (written, removed, rolled back).
    private func keepBefore(_ rec: EntityRecord) {
        guard touchedInThisMutation(rec), rec.mutationMark & EntityRecord.beforeNotKept != 0 else { return }
        let before = reconstructedBefore(rec)
        entityJournal[Int(rec.journalIndex)].old = before
        rec.mutationMark &= ~EntityRecord.beforeNotKept
    }

    /// Whether every entity `rec` holds had a value before the mutation
    /// (then a refresh in place can keep no value: see `reconstructedBefore`).
    /// The last identity found so is remembered (siblings share their child).
    private func childrenBeforeKnown(_ rec: EntityRecord) -> Bool {
        // One child, the one found so last time (siblings): nothing to look up.
        if rec.children.isOnly(lastKnownChild) { return true }
        for c in rec.children.keys where c != lastKnownChild {
            guard let child = entities[c] else { return false }
            if touchedInThisMutation(child) && child.mutationMark & EntityRecord.beforeNotKept == 0
                && entityJournal[Int(child.journalIndex)].old == nil { return false }
            lastKnownChild = c
        }
        return true
    }

    /// With the internal checks: the true value before the mutation of every
    /// record refreshed in place, which `reconstructedBefore` must give.
    /// (nil: checks off.)
    var beforeCheck: (ids: [ObjectIdentifier: String], values: [String: JSON])? = nil

    /// Journals `rec` (resident under `id`) unless the running mutation already did.
    @inline(__always)
    private func journal(_ rec: EntityRecord, _ id: String) {
        guard !touchedInThisMutation(rec) else { return }
        rec.journalIndex = Int32(entityJournal.count)
        entityJournal.append((id, rec.value))
    }

    /// The journal entry of `id`, which has no resident record: made (absent
    /// before the mutation) unless it was journaled before it went.
    private func journalAbsent(_ id: String) -> Int {
        if let i = journaledAbsent[id] { return i }
        let i = newAbsentEntry(id)
        journaledAbsent[id] = i
        return i
    }

    /// A journal entry saying `id` was absent before the mutation.
    private func newAbsentEntry(_ id: String) -> Int {
        entityJournal.append((id, nil))
        return entityJournal.count - 1
    }

    /// The document under `key` before the running mutation (nil: absent).
    func documentBeforeMutation(_ key: String) -> JSON? {
        documentRecordNowAndBefore(key).before
    }

    /// The record under `key` now (nil: absent) and its document before
    /// the running mutation, with one lookup.
    func documentRecordNowAndBefore(_ key: String) -> (record: DocumentRecord?, before: JSON?) {
        if let doc = documents[key] {
            return (doc, doc.journalMark == mutationGeneration ? documentJournal[Int(doc.journalIndex)].old : doc.value)
        }
        if let i = journaledAbsentDocuments[key] { return (nil, documentJournal[i].old) }
        return (nil, nil)
    }

    /// Journals the document under `key` (its record `doc`, nil when none is
    /// resident) unless the running mutation already did.
    private func journalDocument(_ doc: DocumentRecord?, _ key: String) {
        if let doc {
            guard doc.journalMark != mutationGeneration else { return }
            doc.journalMark = mutationGeneration
            doc.followsRoot = false
            doc.journalIndex = Int32(documentJournal.count)
            documentJournal.append((key, doc.value))
        } else if journaledAbsentDocuments[key] == nil {
            journaledAbsentDocuments[key] = documentJournal.count
            documentJournal.append((key, nil))
        }
    }

    func entity(_ id: String) -> JSON? { entities[id]?.value }
    func document(_ key: String) -> JSON? { documents[key]?.value }
    func requiredMembers(_ type: String) -> Set<String>? { required[type] }

    // MARK: Schema

    func setSchema(_ lists: [(type: String, members: [String])]) {
        for (type, members) in lists {
            requiredLists.removeAll { $0.type == type }
            if members.isEmpty {
                required[type] = nil
            } else {
                var unique: [String] = []
                for m in members where !unique.contains(m) { unique.append(m) }
                required[type] = Set(unique)
                requiredLists.append((type, unique))
            }
        }
    }

    // MARK: Update

    /// Results of `prepareUpdate`: the new versions, not yet written.
    struct PreparedUpdate {
        /// New materialized value per entity of the update, in order of first appearance.
        var values: EntityMap
        /// Merge mode: each entity as the update gave it (nested partials resolved).
        var partials: EntityMap?
        var mode: UpdateMode
        var force: Bool
        var key: String?
        var model: JSON
        /// Every value nests within the stored-depth bound without a walk:
        /// each is a subtree of `model` as it came (a replace whose
        /// identities each occur once: none resolved, none merged), or a
        /// merge gives only scalars (each value is its stored one, within
        /// the bound, with scalar members set: no deeper, or one level).
        var withinDepth: Bool = false
        /// The model's identity when it is an entity (then the first of
        /// `values`): found once here for everything after that asks.
        var root: String? = nil
        /// The top-most entities nested in the root entity's value, when
        /// that value is `model` as it came (a replace whose identities
        /// each occur once), found by the flatten walk: the root's record
        /// takes them without a walk of its own (`setEntity`).
        var rootChildren: Children? = nil
    }

    /// Computes the new versions of an update's entities without writing them.
    /// Throws `bad_request` when a merge would make an entity contain itself.
    func prepareUpdate(model: JSON, key: String?, mode: UpdateMode, force: Bool) throws(ProtocolError) -> PreparedUpdate {
        var winners = EntityMap()
        swap(&winners, &spareEntityMap)
        var rootChildren = Children()
        let (repeated, root) = tree.flattenCounting(model, into: &winners, rootChildren: &rootChildren)
        // With each identity once, every nested occurrence already is its winner.
        let resolved = repeated ? tree.resolve(winners) : winners
        guard mode == .merge else {
            return PreparedUpdate(values: resolved, partials: nil, mode: mode, force: force, key: key, model: model, withinDepth: !repeated, root: root,
                                  rootChildren: repeated || root == nil ? nil : rootChildren)
        }
        // Merge: members present in the update win, absent ones are kept from
        // the stored record; nested entities merge by identity on their own.
        // Short maps searched in place (an update carries a few entities):
        // a dictionary and a set hashed every identity with SipHash.
        var merged = EntityMap()
        var inProgress: [String] = []
        func mergedValue(_ id: String) -> JSON? {
            if let m = merged[id] { return m }
            guard let partial = resolved[id] else { return entities[id]?.value }
            if inProgress.contains(where: { sameText($0, id) }) { return nil }
            inProgress.append(id)
            var base = entities[id]?.value.objectValue ?? JSONObject()
            // Members given as they are stored are not written, and a
            // member list with no object or array has nothing to
            // substitute: a merge that changes nothing of such an entity
            // (an author given again with a post) hands back the stored
            // value itself, with no copy of its member list.
            if let p = partial.objectValue {
                p.members.withUnsafeBufferPointer { b in
                    for i in b.indices { base.merge(b[i].key, b[i].value) }
                }
            }
            // In place: `base` is this function's own copy (substituting a
            // copy of it copied its members a second time).
            if base.holdsContainer {
                tree.substituteMembersInPlace(&base.members) { mergedValue($0) }
            }
            let result = JSON.object(base)
            inProgress.removeLast()
            merged.set(id, result)
            return result
        }
        var values = EntityMap()
        for (id, _) in resolved { if let v = mergedValue(id) { values.set(id, v) } }
        // A kept member may reference an entity that now contains this one.
        // Only a member the update gives can add a reference: when every
        // one it gives is a scalar (a merge of a post's date), the merged
        // values hold no entity their records did not, and there is
        // nothing to search (the search's first pass walked each merged
        // value: ~800 instructions a date merge).
        let givesContainers = givesAContainer(resolved)
        if givesContainers, let (a, b) = findCycle(newValues: values) {
            throw ProtocolError(.badRequest, "merge would make entity '\(clipID(a))' contain itself through '\(clipID(b))'")
        }
        return PreparedUpdate(values: values, partials: resolved, mode: mode, force: force, key: key, model: model, withinDepth: !givesContainers,
                              root: root)
    }

    /// Whether some partial of a merge gives a member whose value is an
    /// object or an array (only such a member can add a nested entity).
    private func givesAContainer(_ partials: EntityMap) -> Bool {
        var gives = false
        partials.forEachValue { v in
            guard !gives, case .object(let o) = v else { return }
            gives = o.holdsContainer
        }
        return gives
    }

    private func findCycle(newValues: EntityMap) -> (String, String)? {
        // The stored graph has no cycle, so a new one takes an edge some
        // new value gained: when none did (a merge of a post's date, or of
        // an author it already had) there is nothing to search — the common
        // merge, which built two dictionaries and walked the graph for it.
        // First, without building a list: whether any new value holds other
        // entities than its record does (a merge of a post's date does not).
        // A cycle also takes an edge to an entity that holds others: when
        // every edge gained leads to one that holds none in the new graph
        // (an author, in a post that changes authors), there is no search
        // either. Only a gained edge that fails this starts the search below.
        var mustSearch = false
        defer { Tree.trim(&childrenScratch) }
        search: for (id, v) in newValues {
            let old = entities[id]?.children ?? Children()
            guard tree.nestedEntitiesDiffer(v, from: old, scratch: &childrenScratch) else { continue }
            for child in childrenScratch.keys where !old.contains(child) {
                if sameText(child, id) {
                    mustSearch = true
                    break search
                }
                let holdsOthers: Bool
                if let i = newValues.index(of: child) {
                    holdsOthers = tree.nestsAnEntity(newValues.value(at: i))
                } else {
                    holdsOthers = !(entities[child]?.children.isEmpty ?? true)
                }
                if holdsOthers {
                    mustSearch = true
                    break search
                }
            }
        }
        guard mustSearch else { return nil }
        var kids: [Children] = []
        kids.reserveCapacity(newValues.count)
        var gained = false
        for (id, v) in newValues {
            let k = tree.nestedEntities(v)
            if !gained, !k.isEmpty {
                let old = entities[id]?.children
                gained = k.contains { old?.contains($0.id) != true }
            }
            kids.append(k)
        }
        guard gained else { return nil }
        // The new values' children by their place in the map (no dictionary
        // of them); a root with no children starts no cycle.
        func children(_ id: String) -> Children {
            if let i = newValues.index(of: id) { return kids[i] }
            return entities[id]?.children ?? Children()
        }
        for (r, (root, _)) in newValues.enumerated() where !kids[r].isEmpty {
            var stack = Array(kids[r].keys)
            var seen = IDSet()
            while let id = stack.popLast() {
                if sameText(id, root) { return (root, kids[r].keys.sorted().first ?? root) }
                if !seen.insert(id).inserted { continue }
                stack.append(contentsOf: children(id).keys)
            }
        }
        return nil
    }

    /// `apply`'s list of changed entities, kept (empty) between updates.
    private var changedScratch: [(String, EntityRecord?)] = []
    /// The records a propagation refreshes, kept (empty) between propagations.
    private var refreshScratch: [(id: String, record: EntityRecord)] = []
    /// An update's entity map, given back empty after its mutation
    /// (`reuse(_:)`) for the next update to fill: no allocation for it.
    private var spareEntityMap = EntityMap()
    /// Where a written record's nested entities are listed to be compared
    /// with the ones it held (`Tree.nestedEntities(_:unlessSameAs:scratch:)`).
    private var childrenScratch = Children()

    /// Takes back an update's entity map once nothing else holds it.
    func reuse(_ map: inout EntityMap) {
        if map.emptiedForReuse() { swap(&spareEntityMap, &map) }
    }
    /// `propagate`'s last lookup by identity (empty outside it).
    private var lastLookupID = ""
    private var lastLookupValue: JSON? = nil
    /// `childrenBeforeKnown`'s last identity found to have a value before (empty outside `propagate`).
    private var lastKnownChild = ""


    /// Writes a prepared update and re-materializes everything that holds its entities.
    /// One op of several (a batch) or a snapshot's load: what `apply`
    /// learns of the update's document (`rootOfDocument`) describes one
    /// update's mutation only, so it is not kept.
    func apply(_ u: PreparedUpdate) -> StoreChange {
        var change = StoreChange()
        apply(u, into: &change)
        rootOfDocument = nil
        return change
    }

    /// `apply`, noting what changed in `change` (empty when given): the
    /// one-op mutation's way, since returning the change set copied its
    /// eight sets and destroyed the original (~600 instructions an update).
    func apply(_ u: PreparedUpdate, into change: inout StoreChange) {
        // The changed ones with their records, for propagation (no lookup
        // again), in a list the store keeps for the next update.
        var changed = changedScratch
        changedScratch = []
        sharedRoot = nil
        rootOfDocument = nil
        // The root entity's record when the update writes it (its value changed).
        var rootRecord: EntityRecord?
        // The root entity's record, written or not (its stored value is the update's document).
        var rootStored: EntityRecord?
        // Entities carried along unchanged and spelled as stored: their
        // stored values can stand in for the request's copies (an entity
        // equal but spelled otherwise cannot: the bytes would change).
        var carriedAlong = IDSet()
        var created = IDSet()
        var first = true
        for (id, newValue) in u.values {
            let resident = entities[id]
            // The root comes first (`PreparedUpdate.root`).
            let isRoot = first && u.root.map { sameText($0, id) } == true
            first = false
            if isRoot { rootStored = resident }
            if let old = resident?.value {
                // Written as it is (an author carried along unchanged): the
                // stored value stays, with its children and marks; nothing
                // to journal, re-index or propagate. Spelled alike is the
                // common case and implies equal: one pass decides both
                // (and, for an object, whether it is equal at all).
                // Equal values have equal records; the record comparison only
                // matters to feed subscriptions.
                switch old.likeness(to: newValue) {
                case .sameEncoding:
                    _ = carriedAlong.insert(id)
                    continue
                case .equal:
                    continue
                case .different:
                    break
                }
                change.valueChanged.insert(id)
                if trackRecordChanges && !tree.sameRecord(old, newValue) { change.recordChanged.insert(id) }
            } else {
                change.recordChanged.insert(id)
                change.valueChanged.insert(id)
                _ = created.insert(id)
            }
            // Its value is the model when `rootChildren` is known.
            let rec = setEntity(id, newValue, resident: resident, withinDepth: u.withinDepth, children: isRoot ? u.rootChildren : nil)
            if isRoot {
                rootRecord = rec
                rootStored = rec
            }
            changed.append((id, rec))
        }
        if !carriedAlong.isEmpty && !created.isEmpty { shareCarriedAlong(changed, u, carriedAlong, created) }
        // The update's own document is rewritten below: propagation need not refresh it first.
        propagate(from: changed, skipping: u.values, deleted: [], except: u.key, into: &change)
        changed.drain()
        changedScratch = changed
        if u.force {
            let written = Set(u.values.ids)
            change.recordChanged.formUnion(written)
            var holders = written
            var docs: Set<String> = []
            var queue = Array(written)
            while let id = queue.popLast() {
                for (r, _) in referrers[id] ?? Holders() where holders.insert(r).inserted { queue.append(r) }
                for (k, _) in documentReferrers[id] ?? Holders() { docs.insert(k) }
            }
            change.forcedHolders = IDSet(holders)
            change.documentsForced = IDSet(docs)
            // A copy to filter by: a closure stored in the lazy sequence
            // that captured `change` itself boxed it on the heap on every
            // `apply`, forced or not.
            let valueChanged = change.valueChanged.asIDSet
            refreshInCollections(holders.lazy.filter { !valueChanged.contains($0) }, changed: false)
        }
        if let key = u.key {
            // The model's entities substituted with their stored values: when
            // the model is an entity, its stored value (read from its record,
            // no identity read or lookup).
            let value: JSON
            if let rootStored {
                value = rootStored.value
                if beforeCheck != nil && !value.hasSameEncoding(as: tree.substituteAny(u.model) { entities[$0]?.value }.0) {  // under the internal checks
                    preconditionFailure("Concord internal check failed: the document of update root '\(u.root!)' is not that entity's stored value")
                }
            } else {
                value = tree.substituteAny(u.model) { entities[$0]?.value }.0
            }
            let (old, doc) = setDocument(key, value, resident: documents[key], entity: rootStored == nil ? nil : u.root)
            let (docChanged, asRoot) = documentChanged(old: old, new: value, root: u.root, change: change)
            if docChanged {
                change.documentsChanged.insert(key)
                // Changed as its root entity did: render can tell from the record alone.
                if asRoot, let rootRecord, let doc {
                    doc.followsRoot = true
                    rootOfDocument = (Unmanaged.passUnretained(rootRecord), u.root!)
                }
            }
            if u.force { change.documentsForced.insert(key) }
        }
    }

    /// The members of the update's root entity when `apply` replaced them
    /// (`shareCarriedAlong`): same bytes, another buffer (nil otherwise).
    private(set) var sharedRoot: [JSONObject.Member]?

    /// The record of the running update's root entity when the update's
    /// document is, before and after, that entity's stored value and
    /// changed with it (`documentChanged`; the document is marked
    /// `followsRoot`). Render then knows the document's change from the
    /// record alone: no identity read, no lookup, no walk. Unretained: the
    /// record is in `writtenInMutation` until `commit` or `rollback`, which
    /// clear this, as the next `apply` does; the `apply` that returns its
    /// change (a batch's ops, a snapshot's load) does not keep it, so it
    /// only ever describes a one-update mutation's document.
    private(set) var rootOfDocument: (record: Unmanaged<EntityRecord>, id: String)?

    /// The root entity and its record when the running update's document
    /// `doc` changed exactly as that entity did (see `rootOfDocument`).
    func root(following doc: DocumentRecord) -> (record: EntityRecord, id: String)? {
        guard doc.followsRoot, doc.journalMark == mutationGeneration, let r = rootOfDocument else { return nil }
        return (r.record.takeUnretainedValue(), r.id)
    }

    /// The entities the update created hold the stored values of the
    /// entities the request carried along unchanged (an author in each of
    /// a feed's new posts), not the request's copies of them: one copy of
    /// an entity in memory however many entities hold it, as propagation
    /// leaves them after a change (100,000 posts of 1,000 authors: 70.1 →
    /// 59.0 MB). Only values spelled as stored stand in (`hasSameEncoding`),
    /// so no written entity's bytes change. Children before parents (the
    /// reverse of the request's pre-order): a parent holding a written
    /// child that was given shared values takes the child's new value.
    /// Each record so changed copies its members once (the request's tree
    /// still holds them; ~2.7k instructions for a post holding an author),
    /// which is why an entity rewritten — not created — keeps the request's
    /// copies: a document rewritten again and again would pay it every
    /// time, and its previous value, copies included, goes at the same time.
    private func shareCarriedAlong(_ changed: [(String, EntityRecord?)], _ u: PreparedUpdate, _ carriedAlong: IDSet, _ created: IDSet) {
        // Written ones that were given shared values: their parents take their new values.
        var shared = IDSet()
        let root = u.root
        for (id, r) in changed.reversed() {
            guard let rec = r, rec.resident, case .object = rec.value else { continue }
            let new = created.contains(id)
            var needed = 0
            for (c, n) in rec.children where (new && carriedAlong.contains(c)) || shared.contains(c) { needed += n }
            guard needed > 0 else { continue }
            shareInPlace(rec, needed) { c in (new && carriedAlong.contains(c)) || shared.contains(c) ? self.entities[c]?.value : nil }
            _ = shared.insert(id)
            if let root, sameText(root, id), case .object(let o) = rec.value {
                sharedRoot = o.members
            }
        }
    }

    /// `rec.value`'s `needed` occurrences of the entities `lookup` knows
    /// replaced by its values, members in order, stopping at the last (an
    /// author before a post's list of tags: the list is not walked).
    private func shareInPlace(_ rec: EntityRecord, _ needed: Int, _ lookup: (String) -> JSON?) {
        guard case .object(var o) = rec.value else { return }
        rec.value = .null
        var left = needed
        o.members.withUnsafeMutableBufferPointer { ms in
            for i in ms.indices {
                if left <= 0 { break }
                let v = ms[i].value
                guard v.isContainer else { continue }
                if case .object(let m) = v, let id = m.identity(idKey: tree.idKey) {
                    if let r = lookup(id) {
                        ms[i].value = r
                        left -= 1
                    }
                    continue
                }
                var found = 0
                let (nv, c) = tree.substituteAny(v) { id in
                    let r = lookup(id)
                    if r != nil { found += 1 }
                    return r
                }
                if c {
                    ms[i].value = nv
                    left -= found
                }
            }
        }
        rec.value = .object(o)
    }

    /// Whether an update's own document changed. A document whose root is
    /// an entity the update wrote is that entity's stored value, before
    /// (propagation kept it so, and skips the update's own document) and
    /// after: it changed exactly when the entity did — no walk of the two
    /// trees (the most common document; ~800 instructions an update).
    /// Otherwise the values are compared. Under the internal checks, both.
    /// `root`: the update's root entity (its model is that entity), which
    /// the update wrote, so the new document is that entity's stored value.
    private func documentChanged(old: JSON?, new: JSON, root: String?, change: StoreChange) -> (changed: Bool, asRoot: Bool) {
        guard let old else { return (true, false) }
        if let root, let oldRoot = old.identity(idKey: tree.idKey), sameText(oldRoot, root) {
            if beforeCheck != nil && new.identity(idKey: tree.idKey).map({ sameText($0, root) }) != true {
                preconditionFailure("Concord internal check failed: the document of update root '\(root)' is not that entity")
            }
            let changed = change.valueChanged.contains(root)
            if beforeCheck != nil && changed != (old != new) {
                preconditionFailure("Concord internal check failed: document of entity '\(root)' changed \(old != new), the entity \(changed)")
            }
            return (changed, true)
        }
        return (old != new, false)
    }

    // MARK: Delete

    /// Deletes an entity and everything the schema cascades to.
    func deleteEntity(_ id: String) -> StoreChange {
        var change = StoreChange()
        var deleted: Set<String> = [id]
        var queue = [id]
        let requiredFn: (String) -> Set<String>? = { self.required[$0] }
        while let d = queue.popLast() {
            for (parent, _) in referrers[d] ?? Holders() where !deleted.contains(parent) {
                guard let pv = entities[parent]?.value else { continue }
                if case .deleted = tree.prune(pv, deleted: deleted, required: requiredFn, current: { _ in nil }) {
                    deleted.insert(parent)
                    queue.append(parent)
                }
            }
        }
        change.deleted = IDSet(deleted)
        // Who held the deleted entities, before they go.
        var parents: Set<String> = []
        var docs: Set<String> = []
        for d in deleted {
            for (p, _) in referrers[d] ?? Holders() where !deleted.contains(p) { parents.insert(p) }
            for (k, _) in documentReferrers[d] ?? Holders() { docs.insert(k) }
        }
        for d in deleted {
            if entities[d] != nil {
                removeEntity(d)
            } else {
                // Not in memory, maybe in the backend: the delete must reach it too.
                _ = journalAbsent(d)
            }
        }
        change.recordChanged = IDSet(deleted.union(parents))
        propagate(from: [], skipping: EntityMap(), deleted: deleted, seeds: parents, documents: IDSet(docs), into: &change)
        return change
    }

    func deleteDocument(_ key: String) -> StoreChange {
        var change = StoreChange()
        if let doc = documents[key] {
            setDocument(key, nil, resident: doc)
        } else {
            journalDocument(nil, key)  // the backend may hold it
        }
        change.documentsDeleted.insert(key)
        return change
    }

    func clear() {
        commit()
        for rec in entities.values { rec.resident = false }
        entities.removeAllRecords()
        documents = [:]
        referrers = [:]
        documentReferrers = [:]
        collections = [:]
        collectionReferrers = [:]
    }

    // MARK: Propagation

    /// Re-materializes every entity and document that holds a changed one,
    /// children before parents, and records what changed.
    /// Where a `(id: String, record: EntityRecord)` entry of propagation's
    /// list keeps its record (checked by `PrefetchLayoutTests`).
    static let refreshEntryRecordOffset = MemoryLayout<String>.stride

    private func propagate(
        from changed: [(String, EntityRecord?)],
        skipping written: EntityMap,
        deleted: Set<String>,
        seeds extraSeeds: Set<String> = [],
        documents extraDocs: IDSet = IDSet(),
        except rewrittenDocument: String? = nil,
        into change: inout StoreChange
    ) {
        // The common update: what changed is held by no entity (a post, a
        // document's root entity). Only documents and collections that hold
        // it change; the walk's bookkeeping below is not set up.
        if extraSeeds.isEmpty && extraDocs.isEmpty && deleted.isEmpty
            && !changed.contains(where: { ($0.1?.held ?? EntityRecord.heldByEntities) & EntityRecord.heldByEntities != 0 }) {
            var docs = IDSet()
            if !documentReferrers.isEmpty {
                for (id, rec) in changed { addDocumentHolders(of: id, held: rec!.held, to: &docs) }
            }
            refreshInCollections(change.valueChanged)
            refreshHolders(docs, except: rewrittenDocument, deleted: deleted, into: &change)
            return
        }
        // Upward closure through referrers, marked on the records (a
        // referrer is resident: the index is kept from resident records'
        // children; deleted records are gone from `entities` by now).
        walkGeneration &+= 1
        let generation = walkGeneration
        // The written records are marked (never refreshed) once a referrer is
        // found: an update that nobody holds looks nothing more up.
        var writtenMarked = false
        // The store's list, kept between propagations and emptied by
        // `drain` (grown once, not per rename; and an array of pairs freed
        // whole destroys them through the runtime's generic path, ~60
        // instructions a post).
        var toRefresh: [(id: String, record: EntityRecord)] = []
        swap(&toRefresh, &refreshScratch)
        defer {
            if !toRefresh.isEmpty { toRefresh.drain() }
            if toRefresh.capacity <= 4096 { swap(&toRefresh, &refreshScratch) }
        }
        // Whether a record to refresh holds another: only then does the
        // order matter (a referrer of the changed entities alone, the common
        // case, has no child to refresh first, and its children are not looked up).
        var chained = false
        var docs = extraDocs
        let hasDocuments = !documentReferrers.isEmpty
        // Referrers found and not visited yet: (identity, whether it is
        // itself to be refreshed). The changed entities and the seeds are
        // visited straight away, so an update nobody holds allocates nothing.
        var queue: [(String, EntityRecord?, Bool)] = []
        func visit(_ id: String, _ rec: EntityRecord?, _ isRefreshed: Bool) {
            // A resident record says whether anyone holds it; otherwise look.
            let held = rec?.held ?? (EntityRecord.heldByEntities | EntityRecord.heldByDocuments)
            if hasDocuments { addDocumentHolders(of: id, held: held, to: &docs) }
            guard held & EntityRecord.heldByEntities != 0 else { return }
            // The holders read in place: neither the table nor its value is copied.
            _ = referrers.withValue(id) { holders in
                if !writtenMarked {
                    writtenMarked = true
                    for (w, _) in written { entities[w]?.mark(generation, .done) }
                }
                if isRefreshed { chained = true }
                // The holders' records are scattered over the heap: ask for
                // all of them before the walk below reads each.
                // (Read as words: a `Holding`'s first word is its record's
                // address. A retain would write to each record, and wait for it.)
                holders.forEachFirstWordPastTheFirst { EntityRecord.prefetchRecord(at: $0) }
                holders.forEach { r, h in
                    let rec = h.record
                    guard rec.walkGeneration != generation else { return }
                    rec.mark(generation, .pending)
                    toRefresh.append((r, rec))
                    // A referrer nobody holds has nothing to visit (an author's
                    // hundred posts): it is not queued.
                    if rec.held != 0 { queue.append((r, rec, true)) }
                }
            }
        }
        var seeds: [(String, EntityRecord)] = []
        for id in extraSeeds {
            guard let rec = entities[id], rec.walkGeneration != generation else { continue }
            rec.mark(generation, .pending)
            toRefresh.append((id, rec))
            seeds.append((id, rec))
        }
        for (id, rec) in changed { visit(id, rec, false) }
        for (id, rec) in seeds { visit(id, rec, true) }
        while let (id, rec, isRefreshed) = queue.popLast() { visit(id, rec, isRefreshed) }
        // Children first: a DFS over the marked records, refreshing on the
        // way out. Without deletes every one of them changes (it embeds a
        // child whose materialized value changed), so no comparison is
        // needed; with deletes, pruning decides.
        // (Only when there is something to add: `changed` may share the set's
        // storage, and reserving would copy it.)
        if !toRefresh.isEmpty { change.valueChanged.reserveNew(toRefresh.count) }
        let pruning = !deleted.isEmpty
        // The last lookup (`currentValue`) is remembered in the store, not
        // in locals: `refresh` is recursive, and locals it captures were
        // boxed on the heap, two allocations per propagation.
        defer {
            lastLookupID = ""
            lastLookupValue = nil
            lastKnownChild = ""
        }
        func refresh(_ id: String, _ rec: EntityRecord) {
            guard rec.walkState == .pending else { return }
            rec.walkState = .inProgress
            if chained {
                for c in rec.children.keys {
                    if let child = entities[c], child.walkGeneration == generation, child.walkState == .pending { refresh(c, child) }
                }
            }
            if !pruning {
                refreshEntity(rec, id)
                // New to the set: each record is refreshed once, and the
                // written ones (the set's members so far) are marked done.
                change.valueChanged.insertNew(id)
            } else if case .kept(let new) = tree.prune(rec.value, deleted: deleted, required: { self.required[$0] }, current: { self.currentValue($0) }),
                      rec.value != new {
                // Pruning deletes may drop nested identities: a full write.
                setEntity(id, new)
                change.valueChanged.insert(id)
            }
            rec.walkState = .done
        }
        // Each refresh reads its record's member list: the ones a few
        // records ahead are asked for while this one is refreshed.
        // (The record's address is read from the list as a word: copying
        // the entry out would retain the record and its identity.)
        let ahead = 4
        let n = toRefresh.count
        let recordOffset = Self.refreshEntryRecordOffset
        var i = 0
        for (id, rec) in toRefresh {
            if i + ahead < n {
                let word = toRefresh.withUnsafeBufferPointer { UnsafeRawPointer($0.baseAddress! + i + ahead).load(fromByteOffset: recordOffset, as: UInt.self) }
                EntityRecord.prefetchValue(ofRecordAt: word)
            }
            refresh(id, rec)
            i += 1
        }
        if !deleted.isEmpty { removeFromCollections(deleted) }
        refreshInCollections(change.valueChanged)
        refreshHolders(docs, except: rewrittenDocument, deleted: deleted, into: &change)
    }

    /// The documents holding `id` as a top-most entity, added to `docs`
    /// (`held`: its record's `held` bits; no lookup when they say none).
    @inline(__always)
    private func addDocumentHolders(of id: String, held: UInt8, to docs: inout IDSet) {
        guard held & EntityRecord.heldByDocuments != 0, let holders = documentReferrers[id] else { return }
        for (k, _) in holders { docs.insert(k) }
    }

    /// Re-materializes the documents in `docs` (they hold a changed or
    /// deleted entity), but not `rewrittenDocument` (the update writes it).
    private func refreshHolders(_ docs: IDSet, except rewrittenDocument: String?, deleted: Set<String>, into change: inout StoreChange) {
        for key in docs where key != rewrittenDocument {
            guard let doc = documents[key] else { continue }
            let old = doc.value
            if let root = old.identity(idKey: tree.idKey), deleted.contains(root) {
                setDocument(key, nil, resident: doc)
                change.documentsDeleted.insert(key)
                continue
            }
            let new: JSON
            if deleted.isEmpty {
                // It holds an entity whose materialized value changed, so it
                // changes too: no comparison (as for entity referrers above).
                new = tree.substituteAny(old) { self.entities[$0]?.value }.0
                assert(old != new, "a document holding a changed entity always changes")
                refreshDocument(doc, key, new)
                change.documentsChanged.insert(key)
                continue
            } else if case .kept(let v) = tree.prune(old, deleted: deleted, required: { _ in nil }, isRoot: false, current: { self.entities[$0]?.value }) {
                new = v
            } else {
                new = .null
            }
            if old != new {
                setDocument(key, new, resident: doc)
                change.documentsChanged.insert(key)
            }
        }
    }

    // MARK: Installing loaded records (read-through; not a mutation)

    func installEntity(_ id: String, _ value: JSON) { setEntity(id, value) }
    func installDocument(_ key: String, _ value: JSON) { setDocument(key, value) }

    // MARK: Eviction (memory limit; the backend keeps the records)

    /// True when a resident entity, document or collection references `id`.
    func isReferenced(_ id: String) -> Bool {
        referrers[id] != nil || documentReferrers[id] != nil || collectionReferrers[id] != nil
    }

    func evictEntity(_ id: String) { removeEntity(id) }
    func evictDocument(_ key: String) { setDocument(key, nil) }

    // MARK: Bookkeeping

    /// Bumped by every propagation; records carry the one that last visited them.
    private var walkGeneration: UInt64 = 0

    /// Whether the running mutation touched `rec` (then its first value is in
    /// the journal: a resident record is journaled before it is marked, and
    /// a record replaced within the mutation was journaled by identity first).
    @inline(__always)
    fileprivate func touchedInThisMutation(_ rec: EntityRecord) -> Bool {
        rec.mutationMark >> EntityRecord.markBits == mutationGeneration
    }

    @inline(__always)
    private func writtenInThisMutation(_ rec: EntityRecord) -> Bool {
        touchedInThisMutation(rec) && rec.mutationMark & EntityRecord.written != 0
    }

    /// `withinDepth`: `value` is known to nest within the stored-depth bound
    /// (see `PreparedUpdate.withinDepth`, `EntityRecord.reshaped`).
    /// `resident`: the record under `id` when the caller has looked it up. Returns the record now resident.
    @discardableResult
    private func setEntity(_ id: String, _ value: JSON, withinDepth: Bool = false) -> EntityRecord {
        setEntity(id, value, resident: entities[id], withinDepth: withinDepth)
    }

    /// `children`: `value`'s nested entities when the caller knows them
    /// (`PreparedUpdate.rootChildren`), else they are found by a walk.
    private func setEntity(_ id: String, _ value: JSON, resident: EntityRecord?, withinDepth: Bool, children known: Children? = nil) -> EntityRecord {
        if beforeCheck != nil, let known, known != tree.nestedEntities(value) {  // under the internal checks
            preconditionFailure("Concord internal check failed: the nested entities of '\(id)' found by the flatten walk differ from its value's")
        }
        var absentEntry = -1
        if let resident {
            keepBefore(resident)
            journal(resident, id)
        } else {
            // Resident again (removed earlier in the mutation): the record keeps its entry.
            absentEntry = journaledAbsent.removeValue(forKey: id) ?? newAbsentEntry(id)
        }
        let mark = withinDepth ? EntityRecord.written : EntityRecord.written | EntityRecord.reshaped
        if let rec = resident {
            if !writtenInThisMutation(rec) { writtenInMutation.append((id, rec)) }
            markMutation(rec, mark)
            let newChildren = known.map { $0 == rec.children ? nil : $0 } ?? tree.nestedEntities(value, unlessSameAs: rec.children, scratch: &childrenScratch)
            if let newChildren {
                markMutation(rec, EntityRecord.childrenChanged)
                for (c, n) in rec.children { adjustReferrer(of: c, entity: id, rec, by: -n) }
                for (c, n) in newChildren { adjustReferrer(of: c, entity: id, rec, by: n) }
                rec.children = newChildren
            }
            rec.value = value
            return rec
        } else {
            let newChildren = known ?? tree.nestedEntities(value)
            let rec = EntityRecord(value: value, children: newChildren)
            rec.journalIndex = Int32(absentEntry)
            rec.held = (referrers[id] == nil ? 0 : EntityRecord.heldByEntities)
                | (documentReferrers[id] == nil ? 0 : EntityRecord.heldByDocuments)
            markMutation(rec, mark | EntityRecord.childrenChanged)
            writtenInMutation.append((id, rec))
            entities[id] = rec
            rec.resident = true
            for (c, n) in newChildren { adjustReferrer(of: c, entity: id, rec, by: n) }
            return rec
        }
    }

    /// An entity's current value during propagation; siblings usually hold
    /// the same changed child (an author's posts), so the last lookup is
    /// remembered (a method, not a closure: a closure's context was
    /// retained and released three times a referrer).
    private func currentValue(_ id: String) -> JSON? {
        if id == lastLookupID { return lastLookupValue }
        lastLookupID = id
        lastLookupValue = entities[id]?.value
        return lastLookupValue
    }

    /// The record's nested entities substituted with their current values:
    /// the same nested identities, so the normalized structure stays as it
    /// is. Journaled at its first touch without a copy of its value when
    /// it can be (`EntityRecord.beforeNotKept`): then the substitution is
    /// in place, and an author's hundred posts are neither copied nor, at
    /// commit, freed. Otherwise the old value moves into the journal.
    private func refreshEntity(_ rec: EntityRecord, _ id: String) {
        if touchedInThisMutation(rec) {
            substituteInPlace(rec)
        } else if childrenBeforeKnown(rec) {
            if beforeCheck != nil {
                beforeCheck!.ids[ObjectIdentifier(rec)] = id
                beforeCheck!.values[id] = rec.value
            }
            rec.journalIndex = Int32(entityJournal.count)
            entityJournal.append((id, nil))
            markMutation(rec, EntityRecord.substituted | EntityRecord.beforeNotKept)
            substituteInPlace(rec)
            return
        } else {
            rec.journalIndex = Int32(entityJournal.count)
            var value = tree.substituteNested(rec.value) { currentValue($0) }
            swap(&value, &rec.value)  // `value` is the old one now
            entityJournal.append((id, value))
        }
        markMutation(rec, EntityRecord.substituted)
    }

    /// `rec.value`'s nested entities substituted in place (the members are
    /// written where they are when the record holds the only reference).
    private func substituteInPlace(_ rec: EntityRecord) {
        guard case .object(var o) = rec.value else {
            rec.value = tree.substituteNested(rec.value) { currentValue($0) }
            return
        }
        rec.value = .null
        tree.substituteMembersInPlace(&o.members) { [unowned(unsafe) self] in currentValue($0) }
        rec.value = .object(o)
    }

    /// The document's top-most entities re-substituted: same children.
    private func refreshDocument(_ doc: DocumentRecord, _ key: String, _ value: JSON) {
        journalDocument(doc, key)
        doc.value = value
        doc.followsRoot = false
    }

    private func removeEntity(_ id: String) {
        guard let rec = entities.removeValue(forKey: id) else {
            _ = journalAbsent(id)
            return
        }
        keepBefore(rec)
        rec.resident = false
        journal(rec, id)
        journaledAbsent[id] = Int(rec.journalIndex)
        for (c, n) in rec.children { adjustReferrer(of: c, entity: id, rec, by: -n) }
    }

    /// Returns the value it had.
    @discardableResult
    private func setDocument(_ key: String, _ value: JSON?) -> JSON? {
        setDocument(key, value, resident: documents[key]).before
    }

    /// `resident`: the record under `key` (looked up by the caller).
    /// Returns the value before and the record now (nil: removed).
    /// `entity`: `value`'s identity, when the caller knows it is that entity's value.
    @discardableResult
    private func setDocument(_ key: String, _ value: JSON?, resident old: DocumentRecord?, entity: String? = nil) -> (before: JSON?, record: DocumentRecord?) {
        if beforeCheck != nil, let entity, let value, tree.topEntities(value) != Children(entity) {  // under the internal checks
            preconditionFailure("Concord internal check failed: the document '\(key)' is not the value of '\(entity)'")
        }
        journalDocument(old, key)
        let before = old?.value
        let newChildren: Children
        if let old, let value {
            let found = entity.map { old.children.isOnly($0) ? nil : Children($0) }
                ?? tree.topEntities(value, unlessSameAs: old.children, scratch: &childrenScratch)
            guard let c = found else {
                old.value = value
                old.followsRoot = false
                return (before, old)
            }
            newChildren = c
        } else {
            newChildren = entity.map { Children($0) } ?? value.map { tree.topEntities($0) } ?? Children()
        }
        if let old {
            for (c, n) in old.children { adjustDocumentReferrer(of: c, key: key, by: -n) }
        }
        if let value {
            let doc = DocumentRecord(value: value, children: newChildren)
            // The key's journal entry moves to the new record.
            if let old {
                doc.journalMark = old.journalMark
                doc.journalIndex = old.journalIndex
            } else if let i = journaledAbsentDocuments.removeValue(forKey: key) {
                doc.journalMark = mutationGeneration
                doc.journalIndex = Int32(i)
            }
            documents[key] = doc
            for (c, n) in newChildren { adjustDocumentReferrer(of: c, key: key, by: n) }
            return (before, doc)
        } else {
            documents[key] = nil
            if let old { journaledAbsentDocuments[key] = Int(old.journalIndex) }
            return (before, nil)
        }
    }

    private func adjustReferrer(of child: String, entity: String, _ record: EntityRecord, by n: Int) {
        let held = referrers.modify(child, default: Holders()) { holders in
            // One lookup of `entity`: found, changed in place; absent, added
            // (a decrease of an absent holder adds nothing).
            if n < 0 {
                holders.modify(entity, default: Holding(record: record, count: 0)) { h in
                    h.count += n
                    return h.count > 0
                }
            } else if n > 0 {
                holders.modify(entity, default: Holding(record: record, count: 0)) { h in
                    Self.add(n, record, to: &h)
                    return true
                }
            }
            return !holders.isEmpty
        }
        entities[child]?.setHeld(EntityRecord.heldByEntities, held)
    }

    @inline(__always)
    private static func add(_ n: Int, _ record: EntityRecord, to h: inout Holding) {
        h = Holding(record: record, count: h.count + n)
    }

    private func adjustDocumentReferrer(of child: String, key: String, by n: Int) {
        let held = documentReferrers.modify(child, default: Holders()) { holders in
            if n != 0 {
                holders.modify(key, default: 0) { v in
                    v += n
                    return v > 0
                }
            }
            return !holders.isEmpty
        }
        entities[child]?.setHeld(EntityRecord.heldByDocuments, held)
    }

}

func clipID(_ s: String) -> String {
    s.count > 64 ? String(s.prefix(64)) + "…" : s
}

// MARK: - Internal consistency (CONCORD_INTERNAL_CHECKS)

extension EntityRecord {
    @inline(__always)
    func setHeld(_ bit: UInt8, _ on: Bool) {
        held = on ? held | bit : held & ~bit
    }

    @inline(__always)
    func mark(_ generation: UInt64, _ state: WalkState) {
        walkGeneration = generation
        walkState = state
    }
}

extension Store {
    /// Every way the normalized structure can disagree with itself, as
    /// sentences (empty when consistent). O(size of the store): for tests,
    /// stress, fuzzing and debug runs only.
    func invariantViolations() -> [String] {
        var problems: [String] = []
        func note(_ s: String) { if problems.count < 20 { problems.append(s) } }
        var expectedReferrers: [String: [String: Int]] = [:]
        for (id, rec) in entities {
            let held = (referrers[id] == nil ? 0 : EntityRecord.heldByEntities) | (documentReferrers[id] == nil ? 0 : EntityRecord.heldByDocuments)
            if rec.held != held { note("entity \(id): held flags \(rec.held) but the referrer indexes say \(held)") }
            if !rec.resident { note("entity \(id): resident but its record says it is not") }
            let children = tree.nestedEntities(rec.value)
            if children != rec.children { note("entity \(id): children \(rec.children) but its value holds \(children)") }
            for (c, n) in rec.children {
                expectedReferrers[c, default: [:]][id] = n
                // A resident record's references are resident, and materialized.
                if entities[c] == nil { note("entity \(id) references \(c), which is not resident") }
            }
            if tree.substituteNested(rec.value, { self.entities[$0]?.value }) != rec.value {
                note("entity \(id) is not materialized with its children's current values")
            }
        }
        if expectedReferrers != Dictionary(uniqueKeysWithValues: referrers.map { ($0.key, Dictionary(uniqueKeysWithValues: $0.value.map { ($0.key, $0.value.count) })) }) { note("the referrer index disagrees with the records' children") }
        for (child, holders) in referrers {
            for (h, holding) in holders where entities[h] !== holding.record {
                note("the referrer index holds a record of \(h) (holding \(child)) that is not the resident one")
            }
        }
        var expectedDocReferrers: [String: [String: Int]] = [:]
        for (key, doc) in documents {
            let children = tree.topEntities(doc.value)
            if children != doc.children { note("document \(key): children \(doc.children) but its value holds \(children)") }
            for (c, n) in doc.children {
                expectedDocReferrers[c, default: [:]][key] = n
                if entities[c] == nil { note("document \(key) references \(c), which is not resident") }
            }
            if tree.substituteAny(doc.value, { self.entities[$0]?.value }).0 != doc.value {
                note("document \(key) is not materialized with its entities' current values")
            }
        }
        if expectedDocReferrers != Dictionary(uniqueKeysWithValues: documentReferrers.map { ($0.key, Dictionary(uniqueKeysWithValues: Array($0.value))) }) { note("the document referrer index disagrees with the documents") }
        var expectedCollectionReferrers: [String: [String: Int]] = [:]
        for (name, c) in collections {
            if c.ids.count != c.values.count { note("collection \(name): \(c.ids.count) ids but \(c.values.count) values"); continue }
            for (i, id) in c.ids.enumerated() {
                expectedCollectionReferrers[id, default: [:]][name, default: 0] += 1
                guard let e = entities[id] else { note("collection \(name)[\(i)] is \(id), which is not resident"); continue }
                if e.value != c.values[i] { note("collection \(name)[\(i)] holds an old value of \(id)") }
            }
        }
        if expectedCollectionReferrers != collectionReferrers { note("the collection referrer index disagrees with the collections") }
        return problems
    }
}
