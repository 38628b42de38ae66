import ConcordJSON

/// Pure functions over model trees: flattening, swapping entities, pruning
/// deleted ones, and the identity diff that fills `changed`/`deleted`.
///
/// "Entity" means an object whose identity member holds a non-empty string
/// or an integer (PROTOCOL.md §2). All functions are value-in/value-out and
/// allocate only along the paths they change.
struct Tree {
    let idKey: String

    // MARK: Flattening

    /// Every entity of `root` with its winning subtree (the last occurrence in
    /// pre-order), the identities in order of first appearance.
    func flatten(_ root: JSON) -> EntityMap { flattenCounting(root).winners }

    /// `flatten`, also telling whether some identity occurs more than once.
    func flattenCounting(_ root: JSON) -> (winners: EntityMap, repeated: Bool) {
        var winners = EntityMap()
        let repeated = flattenCounting(root, into: &winners).repeated
        return (winners, repeated)
    }

    /// `flattenCounting`, into `winners` (empty: a map given back to be
    /// reused); returns whether some identity occurs more than once, and
    /// `root`'s identity when it is an entity (then the first of `winners`).
    func flattenCounting(_ root: JSON, into winners: inout EntityMap) -> (repeated: Bool, root: String?) {
        var rootChildren = Children()
        return flattenCounting(root, into: &winners, rootChildren: &rootChildren)
    }

    /// `flattenCounting`, also listing in `rootChildren` (empty) the
    /// top-most entities nested in `root` when `root` is an entity — what
    /// `nestedEntities(root)` gives, found by the same walk. (When an
    /// identity repeats, `root` may not be its own winner: the caller
    /// then does not use the list.)
    func flattenCounting(_ root: JSON, into winners: inout EntityMap, rootChildren: inout Children) -> (repeated: Bool, root: String?) {
        var repeated = false
        guard case .object(let o) = root, let id = o.identity(idKey: idKey) else {
            forEachEntity(root) { id, v, _ in if !winners.set(id, v) { repeated = true } }
            return (repeated, nil)
        }
        // The root's identity kept, and the first entity on each path
        // below it noted as its child.
        _ = winners.set(id, root)
        var index: Children.Index? = nil
        let members = o.members
        for i in members.indices where members[i].value.isContainer {
            forEachEntity(members[i].value) { id, v, topMost in
                if !winners.set(id, v) { repeated = true }
                if topMost { rootChildren.add(id, index: &index) }
            }
        }
        return (repeated, id)
    }

    /// `body` with the identity and value of every entity in `value`
    /// (itself included), in pre-order, and whether it is the first entity
    /// on its path from `value` (no entity above it); only containers are entered.
    @inline(__always)
    func forEachEntity(_ value: JSON, _ body: (String, JSON, _ topMost: Bool) -> Void) {
        func walk(_ v: JSON, below: Bool) {
            switch v {
            case .object(let o):
                var below = below
                if let id = o.identity(idKey: idKey) {
                    body(id, v, !below)
                    below = true
                }
                let members = o.members
                for i in members.indices where members[i].value.isContainer { walk(members[i].value, below: below) }
            case .array(let a):
                for i in a.indices where a[i].isContainer { walk(a[i], below: below) }
            default:
                break
            }
        }
        walk(value, below: false)
    }

    /// Each winner with its nested entities replaced by their own resolved winners,
    /// so every occurrence of an identity in the result is the same value.
    func resolve(_ winners: EntityMap) -> EntityMap {
        var resolved: [String: JSON] = [:]
        resolved.reserveCapacity(winners.count)
        var inProgress: Set<String> = []
        func resolveID(_ id: String) -> JSON? {
            if let r = resolved[id] { return r }
            guard let w = winners[id] else { return nil }
            if inProgress.contains(id) { return nil }  // unreachable for one tree; kept as a guard
            inProgress.insert(id)
            let r = substituteNested(w) { resolveID($0) }
            inProgress.remove(id)
            resolved[id] = r
            return r
        }
        // In the winners' order (nested identities may resolve first).
        var out = EntityMap()
        for (id, _) in winners { if let r = resolveID(id) { out.set(id, r) } }
        return out
    }

    // MARK: Substitution

    /// `value` with every top-most nested entity (not `value` itself) replaced by
    /// `lookup(id)` when that returns a value.
    func substituteNested(_ value: JSON, _ lookup: (String) -> JSON?) -> JSON {
        switch value {
        case .object(let o):
            guard let members = Self.substitutingMembers(o.members, self, lookup) else { return value }
            return .object(JSONObject(members))
        case .array:
            return substituteAny(value, lookup).0
        default:
            return value
        }
    }

    /// `members` with the entities below them substituted, or nil when none
    /// was: scalars are skipped without copying them, and the array is
    /// copied once, at the first change (a post of four members holding its
    /// author copies its members once and retains nothing else).
    @inline(__always)
    private static func substitutingMembers(_ members: [JSONObject.Member], _ tree: Tree, _ lookup: (String) -> JSON?) -> [JSONObject.Member]? {
        // Copied by copy-on-write at the first change.
        var out = members
        var changed = false
        for i in out.indices where out[i].value.isContainer {  // nothing below a scalar
            let (nv, c) = tree.substituteAny(out[i].value, lookup)
            if c {
                out[i].value = nv
                changed = true
            }
        }
        return changed ? out : nil
    }

    /// The nested entities of a record's members substituted in place, for
    /// a record one of whose entities changed (so the array is written:
    /// a shared one is copied first, once); whether any was. Through the
    /// buffer: one uniqueness check for the array, not one per member
    /// written, and an entity member (an author in a post, the common
    /// case) is replaced without a call returning a pair. (The object case
    /// is `substituteAny`'s written out on purpose: through `substituteAny`
    /// a rename of 100 posts costs 188k instructions instead of 167k.)
    @discardableResult
    func substituteMembersInPlace(_ members: inout [JSONObject.Member], _ lookup: (String) -> JSON?) -> Bool {
        var changed = false
        members.withUnsafeMutableBufferPointer { ms in
            for i in ms.indices {
                switch ms[i].value {
                case .object(let o):
                    if let id = o.identity(idKey: idKey) {
                        if let r = lookup(id) {
                            ms[i].value = r
                            changed = true
                        }
                    } else if let inner = Self.substitutingMembers(o.members, self, lookup) {
                        ms[i].value = .object(JSONObject(inner))
                        changed = true
                    }
                case .array:
                    let (nv, c) = substituteAny(ms[i].value, lookup)
                    if c {
                        ms[i].value = nv
                        changed = true
                    }
                default:
                    break  // nothing below a scalar
                }
            }
        }
        return changed
    }

    /// Every entity `lookup` knows, at any depth and every occurrence, replaced
    /// by its value; an entity it does not know keeps its own members, with the
    /// known entities inside it replaced (`subscribe` with `refresh`).
    func substituteKnown(_ value: JSON, _ lookup: (String) -> JSON?) -> JSON {
        switch value {
        case .object(var o):
            if let id = o.identity(idKey: idKey), let r = lookup(id) { return r }
            for i in o.members.indices { o.members[i].value = substituteKnown(o.members[i].value, lookup) }
            return .object(o)
        case .array(let a):
            return .array(a.map { substituteKnown($0, lookup) })
        default:
            return value
        }
    }

    /// Like `substituteNested` but `value` itself is replaced too when it is an entity.
    func substituteAny(_ value: JSON, _ lookup: (String) -> JSON?) -> (JSON, Bool) {
        switch value {
        case .object(let o):
            if let id = o.identity(idKey: idKey) {
                if let r = lookup(id) { return (r, true) }
                return (value, false)
            }
            guard let members = Self.substitutingMembers(o.members, self, lookup) else { return (value, false) }
            return (.object(JSONObject(members)), true)
        case .array(let a):
            var out: [JSON]? = nil
            for i in a.indices where a[i].isContainer {
                let (nv, c) = substituteAny(a[i], lookup)
                if c {
                    if out == nil { out = a }
                    out![i] = nv
                }
            }
            return out.map { (.array($0), true) } ?? (value, false)
        default:
            return (value, false)
        }
    }

    /// The identities of the top-most entities nested in `value` (not `value` itself), with counts.
    func nestedEntities(_ value: JSON) -> Children {
        var out = Children()
        nestedEntities(value, into: &out)
        return out
    }

    /// `nestedEntities(value)` when they differ from `old`, nil when they are
    /// the same list. The list is built in `scratch` (emptied first, its
    /// storage kept), and copied out only when it differs: a record written
    /// again with the same nested entities (an author carried along, a
    /// document of one entity) allocates nothing for them.
    func nestedEntities(_ value: JSON, unlessSameAs old: Children, scratch: inout Children) -> Children? {
        defer { Self.trim(&scratch) }
        return nestedEntitiesDiffer(value, from: old, scratch: &scratch) ? scratch.copied() : nil
    }

    /// Whether `value` nests other entities than `old` lists; the list is
    /// left in `scratch` (emptied first) and nothing is copied. The caller
    /// trims the scratch (``trim(_:)``) when done with the list.
    func nestedEntitiesDiffer(_ value: JSON, from old: Children, scratch: inout Children) -> Bool {
        scratch.removeAll()
        nestedEntities(value, into: &scratch)
        return scratch != old
    }

    /// A long scratch list's storage is not kept for the next one.
    static func trim(_ scratch: inout Children) {
        if scratch.count > 256 { scratch = Children() }
    }

    /// Whether `value` nests any entity (not `value` itself): a walk that
    /// stops at the first, with no list.
    func nestsAnEntity(_ value: JSON) -> Bool {
        func walk(_ v: JSON, top: Bool) -> Bool {
            switch v {
            case .object(let o):
                if !top, o.identity(idKey: idKey) != nil { return true }
                let members = o.members
                for i in members.indices where members[i].value.isContainer {
                    if walk(members[i].value, top: false) { return true }
                }
            case .array(let a):
                for i in a.indices where a[i].isContainer {
                    if walk(a[i], top: false) { return true }
                }
            default:
                break
            }
            return false
        }
        return walk(value, top: true)
    }

    /// `topEntities(value)` when they differ from `old`, nil when they are the same list (as above).
    func topEntities(_ value: JSON, unlessSameAs old: Children, scratch: inout Children) -> Children? {
        if let id = value.identity(idKey: idKey) { return old.isOnly(id) ? nil : Children(id) }
        return nestedEntities(value, unlessSameAs: old, scratch: &scratch)
    }

    private func nestedEntities(_ value: JSON, into out: inout Children) {
        var index: Children.Index? = nil
        func walk(_ v: JSON, top: Bool) {
            switch v {
            case .object(let o):
                if !top, let id = o.identity(idKey: idKey) {
                    out.add(id, index: &index)
                    return
                }
                // By index, and only into containers: no member copied out.
                let members = o.members
                for i in members.indices where members[i].value.isContainer { walk(members[i].value, top: false) }
            case .array(let a):
                for i in a.indices where a[i].isContainer { walk(a[i], top: false) }
            default:
                break
            }
        }
        walk(value, top: true)
    }

    /// The top-most entities of `value`, `value` itself included when it is one.
    func topEntities(_ value: JSON) -> Children {
        if let id = value.identity(idKey: idKey) { return Children(id) }
        return nestedEntities(value)
    }

    // MARK: Deletion

    enum Pruned {
        case kept(JSON)
        case deleted
    }

    /// Removes deleted entities from a tree (PROTOCOL.md §4 delete): an object
    /// member holding one becomes null, unless `required` names that member
    /// for the parent entity's type, which deletes the parent in turn; an
    /// array element is removed. When `current` is given, other nested
    /// entities are replaced by what it returns (store mode: the tree's own
    /// copy of a child is never consulted, the child's current version is);
    /// otherwise the walk descends into them (a private model view).
    func prune(
        _ value: JSON,
        deleted: Set<String>,
        required: (String) -> Set<String>?,
        isRoot: Bool = true,
        current: ((String) -> JSON?)? = nil
    ) -> Pruned {
        switch value {
        case .object(var o):
            let id = o.identity(idKey: idKey)
            if let id {
                if deleted.contains(id) { return .deleted }
                if !isRoot, let current {
                    return .kept(current(id) ?? value)
                }
            }
            var req: Set<String>? = nil
            if let id { req = required(Tree.type(of: id)) }
            for i in o.members.indices {
                switch prune(o.members[i].value, deleted: deleted, required: required, isRoot: false, current: current) {
                case .kept(let nv):
                    o.members[i].value = nv
                case .deleted:
                    if let req, req.contains(o.members[i].key) { return .deleted }
                    o.members[i].value = .null
                }
            }
            return .kept(.object(o))
        case .array(let a):
            var out: [JSON] = []
            out.reserveCapacity(a.count)
            for item in a {
                if case .kept(let nv) = prune(item, deleted: deleted, required: required, isRoot: false, current: current) {
                    out.append(nv)
                }
            }
            return .kept(.array(out))
        default:
            return .kept(value)
        }
    }

    /// The type of an identity: the part before the first ':' ("" when none).
    static func type(of id: String) -> String {
        guard let i = id.utf8.firstIndex(of: UInt8(ascii: ":")) else { return "" }
        return String(id[..<i])
    }

    // MARK: Diff

    /// Every identity occurrence of a tree, in pre-order (repeats included): cheaper
    /// than ``identities(_:)`` when the values are not needed.
    func identityList(_ value: JSON, into out: inout [String]) {
        switch value {
        case .object(let o):
            if let id = o.identity(idKey: idKey) { out.append(id) }
            for m in o.members { identityList(m.value, into: &out) }
        case .array(let a):
            for item in a { identityList(item, into: &out) }
        default:
            break
        }
    }

    /// Identities of a tree in pre-order, each with the value of its first occurrence.
    func identities(_ value: JSON) -> (order: [String], values: [String: JSON]) {
        var order: [String] = []
        var values: [String: JSON] = [:]
        func walk(_ v: JSON) {
            switch v {
            case .object(let o):
                if let id = o.identity(idKey: idKey), values[id] == nil {
                    values[id] = v
                    order.append(id)
                }
                for m in o.members { walk(m.value) }
            case .array(let a):
                for item in a { walk(item) }
            default:
                break
            }
        }
        walk(value)
        return (order, values)
    }

    /// The identities of a tree, as a set (room for `expected`): a model
    /// view's after each change. `identities(_:)` also built their order
    /// and a dictionary of their values, hashing each twice, to be dropped.
    func identitySet(_ value: JSON, expected: Int = 0) -> Set<String> {
        var ids = Set<String>(minimumCapacity: expected)
        forEachEntity(value) { id, _, _ in ids.insert(id) }
        return ids
    }

    /// Every occurrence of an identity in pre-order, with its value.
    func occurrences(_ value: JSON, into out: inout [(id: String, value: JSON)]) {
        switch value {
        case .object(let o):
            if let id = o.identity(idKey: idKey) { out.append((id, value)) }
            for m in o.members { occurrences(m.value, into: &out) }
        case .array(let a):
            for item in a { occurrences(item, into: &out) }
        default:
            break
        }
    }

    /// `diff` when `old` and `new` have the same shape wherever an identity
    /// could be — objects with the same members in the same order, arrays of
    /// the same length, each identity at the same place — else nil. The
    /// changed identities in pre-order, each once (one identity has one
    /// version in a tree, so its first occurrence decides for all).
    func changedInSameShape(_ old: JSON, _ new: JSON, valueChanged: ChangeSet? = nil) -> [String]? {
        var changed: [String] = []
        var listed: Set<String> = []  // past 16 changed identities, not to scan them
        var mismatch = false
        func firstTime(_ id: String) -> Bool {
            if changed.count < 16 { return !changed.contains(id) }
            if listed.isEmpty { listed = Set(changed) }
            return listed.insert(id).inserted
        }
        /// Whether `o` equals `n`; sets `mismatch` when the shapes differ.
        /// `decided`: the nearest enclosing entity is known to have changed,
        /// so only the identities below matter, not whether scalars differ.
        func walk(_ o: JSON, _ n: JSON, decided: Bool) -> Bool {
            switch (o, n) {
            case let (.object(a), .object(b)):
                let am = a.members, bm = b.members
                guard am.count == bm.count else {
                    mismatch = true
                    return false
                }
                if sameBuffer(am, bm) { return true }
                let id = b.identity(idKey: idKey)
                guard id == a.identity(idKey: idKey) else {
                    mismatch = true
                    return false
                }
                // The same entity in both, and the mutation did not change it:
                // one value, so one shape too (see `diff`).
                if let id, let valueChanged, !valueChanged.contains(id) { return true }
                let at = changed.count
                var equal = true
                for i in am.indices {
                    guard am[i].key == bm[i].key else {
                        mismatch = true
                        return false
                    }
                    let below = id == nil ? decided || !equal : !equal
                    // Decided: two scalars say nothing more (not even copied out).
                    if below && !am[i].value.isContainer && !bm[i].value.isContainer { continue }
                    if !walk(am[i].value, bm[i].value, decided: below) {
                        if mismatch { return false }
                        equal = false
                    }
                }
                if !equal, let id, firstTime(id) { changed.insert(id, at: at) }
                return equal
            case let (.array(a), .array(b)):
                guard a.count == b.count else {
                    mismatch = true
                    return false
                }
                if sameBuffer(a, b) { return true }
                var equal = true
                for i in a.indices where !walk(a[i], b[i], decided: decided || !equal) {
                    if mismatch { return false }
                    equal = false
                }
                return equal
            case (.object, _), (_, .object), (.array, _), (_, .array):
                // A container became a scalar or the other way round: an
                // identity may have appeared or gone.
                mismatch = true
                return false
            default:
                // Once decided, the answer is not used: skip the comparison.
                return decided || o == n
            }
        }
        _ = walk(old, new, decided: false)
        return mismatch ? nil : changed
    }

    /// `changed`: identities in `new` whose value differs from `old` or that are new;
    /// `deleted`: identities of `old` absent from `new`. Both in pre-order.
    ///
    /// `valueChanged`: given when `old` and `new` are materialized with the
    /// store's entities before and after one mutation, which changed exactly
    /// these (`StoreChange.valueChanged`): an entity not in it has the same
    /// value in both trees, so its subtree is not compared.
    func diff(old: JSON?, new: JSON?, valueChanged: ChangeSet? = nil) -> (changed: [String], deleted: [String]) {
        // Common case first: the same shape (a value changed, the identities
        // did not move): one walk of both trees, no hashing, no lists of
        // occurrences; unchanged subtrees share buffers and are skipped.
        if let old, let new, let changed = changedInSameShape(old, new, valueChanged: valueChanged) {
            assert(valueChanged == nil || changedInSameShape(old, new) == changed, "an entity the mutation did not change kept its value")
            return (changed, [])
        }
        return diffByIdentities(old: old, new: new)
    }

    /// `diff` in general: every identity's first occurrence in each tree, by hashing.
    func diffByIdentities(old: JSON?, new: JSON?) -> (changed: [String], deleted: [String]) {
        let empty: (order: [String], values: [String: JSON]) = ([], [:])
        let o = old.map { identities($0) } ?? empty
        let n = new.map { identities($0) } ?? empty
        var changed: [String] = []
        for id in n.order {
            if let ov = o.values[id], ov == n.values[id]! { continue }
            changed.append(id)
        }
        var deleted: [String] = []
        for id in o.order where n.values[id] == nil { deleted.append(id) }
        return (changed, deleted)
    }

    /// Equality of two versions of one entity's own record: nested entities
    /// compare by identity only (their contents are their own records).
    func sameRecord(_ a: JSON, _ b: JSON, top: Bool = true) -> Bool {
        switch (a, b) {
        case let (.object(x), .object(y)):
            if !top, let ix = x.identity(idKey: idKey) {
                return ix == y.identity(idKey: idKey)
            }
            if !top, y.identity(idKey: idKey) != nil { return false }
            guard x.count == y.count else { return false }
            for m in x.members {
                guard let other = y[m.key], sameRecord(m.value, other, top: false) else { return false }
            }
            return true
        case let (.array(x), .array(y)):
            guard x.count == y.count else { return false }
            for i in x.indices where !sameRecord(x[i], y[i], top: false) { return false }
            return true
        default:
            return a == b
        }
    }
}

/// What an `update` does to the private trees of model views.
struct UpdateEffect {
    /// Every identity the update carries, with the current version of each
    /// right after the update.
    var swap: EntityMap
    /// Merge mode: each entity as the update gave it.
    var partials: EntityMap?
    var force: Bool
}

extension Tree {
    /// Swaps every subtree whose identity the update carries (PROTOCOL.md §4
    /// update, step 2). Replace mode puts the current version in; merge mode
    /// merges the update's members into the view's own copy, recursively by
    /// identity, and keeps the members the update lacks.
    func rewrite(_ v: JSON, _ u: UpdateEffect) -> (JSON, Bool) {
        switch v {
        case .object(var o):
            if let id = o.identity(idKey: idKey), u.swap.contains(id) {
                if let p = u.partials?[id]?.objectValue {
                    return (merge(o, p, u), true)
                }
                if let s = u.swap[id] { return (s, true) }
            }
            var changed = false
            for i in o.members.indices {
                let (nv, c) = rewrite(o.members[i].value, u)
                if c {
                    o.members[i].value = nv
                    changed = true
                }
            }
            return changed ? (.object(o), true) : (v, false)
        case .array(var a):
            var changed = false
            for i in a.indices {
                let (nv, c) = rewrite(a[i], u)
                if c {
                    a[i] = nv
                    changed = true
                }
            }
            return changed ? (.array(a), true) : (v, false)
        default:
            return (v, false)
        }
    }

    private func merge(_ view: JSONObject, _ partial: JSONObject, _ u: UpdateEffect) -> JSON {
        var out = view
        for i in out.members.indices where partial[out.members[i].key] == nil {
            out.members[i].value = rewrite(out.members[i].value, u).0
        }
        for pm in partial.members {
            if let mine = view[pm.key], let pid = pm.value.identity(idKey: idKey), mine.identity(idKey: idKey) == pid {
                out[pm.key] = rewrite(mine, u).0
            } else {
                out[pm.key] = substituteAny(pm.value) { u.swap[$0] }.0
            }
        }
        return .object(out)
    }
}

/// The entities a record or a document holds directly, each once with how
/// often, in the order a walk of the value meets them (so one value always
/// gives the same list, and two lists are compared element by element).
///
/// Why not `[String: Int]`: most records hold none or a few, and a
/// dictionary hashes every identity to build and again to compare; a short
/// list does neither (a long one is indexed while it is built).
///
/// Why the first one inline: most records that hold an entity hold one,
/// once (a post its author, a message its sender). That one is kept in the
/// struct (`one`), so such a record allocates no list and a propagation
/// reaching it reads its child without a second cache line. Every other
/// list is in `more` — including a single entity held twice — so `one` is
/// set exactly when the list is one identity held once (24 bytes inline:
/// `String?` costs no byte more than `String`).
struct Children: Sequence, Equatable, CustomStringConvertible {
    private var one: String? = nil
    private var more: [(id: String, count: Int)] = []

    init() {}

    init(_ id: String) { one = id }

    var isEmpty: Bool { one == nil && more.isEmpty }
    var count: Int { one == nil ? more.count : 1 }
    var keys: LazyMapSequence<Children, String> { lazy.map(\.id) }

    /// Whether some child's identity satisfies `p`, read in place: a lone
    /// child (the common case) is one test, with no iterator made (the
    /// iterator copied both fields: ~150 instructions for one child).
    @inline(__always)
    func containsID(where p: (String) -> Bool) -> Bool {
        if let one { return p(one) }
        return more.withUnsafeBufferPointer { b in
            for i in b.indices where p(b[i].id) { return true }
            return false
        }
    }

    /// A long list's index: identities by their bytes (`IDTable`, as the
    /// store's tables: "é" composed and decomposed are two entities).
    typealias Index = IDTable<Int>

    /// One more occurrence of `id`; `index` finds identities in a long list
    /// (built here past 16, kept by the caller for the walk, never stored).
    mutating func add(_ id: String, index: inout Index?) {
        if let first = one {
            // The second occurrence: the list moves to `more` (a scratch
            // list's storage, when it has some).
            one = nil
            if sameText(first, id) {
                more.append((first, 2))
            } else {
                more.append((first, 1))
                more.append((id, 1))
            }
            return
        }
        if more.isEmpty {
            one = id
            return
        }
        if more.count < 16 {
            for i in more.indices where sameText(more[i].id, id) {
                more[i].count += 1
                return
            }
            more.append((id, 1))
            return
        }
        if index == nil {
            var built = Index()
            for i in more.indices { built[more[i].id] = i }
            index = built
        }
        if let i = index![id] {
            more[i].count += 1
        } else {
            index![id] = more.count
            more.append((id, 1))
        }
    }

    struct Iterator: IteratorProtocol {
        fileprivate var one: String?
        fileprivate var more: IndexingIterator<[(id: String, count: Int)]>

        mutating func next() -> (id: String, count: Int)? {
            if let first = one {
                one = nil
                return (first, 1)
            }
            return more.next()
        }
    }

    func makeIterator() -> Iterator { Iterator(one: one, more: more.makeIterator()) }

    var underestimatedCount: Int { count }

    /// Empties the list, keeping its storage (a scratch list; element by element: see `drain`).
    mutating func removeAll() {
        one = nil
        more.drain()
    }

    /// The same list in storage of its own, exactly as large (a scratch
    /// list's storage stays with the scratch).
    func copied() -> Children {
        var c = Children()
        c.one = one
        if !more.isEmpty {
            c.more.reserveCapacity(more.count)
            c.more.append(contentsOf: more)
        }
        return c
    }

    /// Whether the list is `id` once and nothing else.
    func isOnly(_ id: String) -> Bool {
        if let first = one { return sameText(first, id) }
        return false
    }

    /// Whether `id` is one of them (a walk of the list).
    func contains(_ id: String) -> Bool {
        if let first = one { return sameText(first, id) }
        for i in more.indices where sameText(more[i].id, id) { return true }
        return false
    }

    static func == (a: Children, b: Children) -> Bool {
        switch (a.one, b.one) {
        case let (x?, y?): return sameText(x, y)
        case (nil, nil):
            guard a.more.count == b.more.count else { return false }
            for i in a.more.indices where a.more[i].count != b.more[i].count || !sameText(a.more[i].id, b.more[i].id) { return false }
            return true
        default: return false
        }
    }

    var description: String { "[" + map { "\($0.id): \($0.count)" }.joined(separator: ", ") + "]" }
}
