import ConcordJSON

/// A model view: one tree, rewritten by every mutation that touches it
/// (PROTOCOL §3: "that tree, private to S"). Subscriptions whose trees are
/// the same value, written the same way (members in the same order,
/// numbers spelled alike), share one view: an update rewrites the tree and
/// writes its event's body once, and each subscriber adds only its header,
/// as on a key's view. They stay alike for good: a rewrite depends only on
/// the tree and the mutation. Its running subscribers hold `tree` as of the
/// last mutation (a paused one keeps what it was last sent in its
/// `PauseState`), so the view keeps no other copy.
///
/// Found for sharing through the engine's `modelShares` by the identity of
/// the tree's root entity, which no rewrite changes (a tree whose root is
/// not an entity is not shared). The view and its subscribers hold each
/// other until the last one leaves (`Engine.unregister`, `clearAll`).
final class ModelView: SharedView {
    var tree: JSON
    /// Every identity in `tree`: what this view watches.
    var ids: Set<String>
    /// The identity of the tree's root entity (nil: the root is not one).
    let root: String?
    /// Fixes the order of the model jobs of one mutation (views are made
    /// in the engine's one total order, so every run numbers them alike).
    let serial: Int
    /// The number of the last render plan that listed this view (`Engine.modelPlanMark`).
    var planMark = 0

    init(tree: JSON, ids: Set<String>, root: String?, serial: Int) {
        self.tree = tree
        self.ids = ids
        self.root = root
        self.serial = serial
    }
}

/// The subscribers of a shared view, with O(1) removal (each subscription
/// remembers its slot). Most keys have one subscriber: it is kept inline,
/// and an array is only allocated for the second.
class SharedView {
    private var first: SubscriptionRecord?
    private var rest: [SubscriptionRecord] = []

    var isEmpty: Bool { first == nil }
    /// More than one subscription.
    var hasSeveral: Bool { !rest.isEmpty }
    /// The subscription, when there is exactly one.
    var only: SubscriptionRecord? { rest.isEmpty ? first : nil }

    func forEach(_ body: (SubscriptionRecord) -> Void) {
        guard let first else { return }
        body(first)
        for s in rest { body(s) }
    }

    /// `forEach` without a retain and a release of each subscription: for
    /// a fan-out's loop, whose `body` must not end a subscription (its
    /// connection's table holds the only other reference).
    @inline(__always)
    func forEachUnretained(_ body: (SubscriptionRecord) -> Void) {
        guard let first else { return }
        body(first)
        rest.withUnsafeBufferPointer { b in
            for i in b.indices { Unmanaged.passUnretained(b[i])._withUnsafeGuaranteedRef(body) }
        }
    }

    func add(_ s: SubscriptionRecord) {
        if first == nil {
            first = s
            s.slot = 0
        } else {
            rest.append(s)
            s.slot = Int32(rest.count)
        }
    }

    func remove(_ s: SubscriptionRecord) {
        let i = Int(s.slot)
        if i == 0, first === s {
            first = rest.popLast()
            first?.slot = 0
        } else if i >= 1, i <= rest.count, rest[i - 1] === s {
            let last = rest.removeLast()
            if i - 1 < rest.count {
                rest[i - 1] = last
                last.slot = Int32(i)
            }
        } else {
            return
        }
        s.slot = -1
    }

    func removeAll() {
        first = nil
        rest = []
    }
}

/// All `key` subscriptions of one cache key share one view: the document is
/// rendered and encoded once per mutation and the bytes go to every subscriber.
/// Its running subscribers always hold the store's document as of the last
/// mutation, so the view keeps no copy of it. A view exists only while the
/// key has two subscriptions or more (48 bytes); most keys have one, which
/// the key table holds itself (``KeySubscribers``).
final class KeyView: SharedView {
    let key: String

    init(key: String) {
        self.key = key
    }
}

/// The subscribers of one key, as the engine's key table holds them: the
/// subscription itself while it is the key's only one (no view object), or
/// a shared ``KeyView`` of two or more. Eight bytes either way: the case is
/// kept in the pointer's spare bits.
///
/// `shared` is the first case on purpose: the first case's pointer is
/// stored as it is, the other's with a tag bit set, which the leak
/// sanitizer's scan does not recognise as a pointer. A view is referenced
/// only from here, so it must be the plain one; a subscription alone is
/// also in its connection's table.
enum KeySubscribers: Named {
    case shared(KeyView)
    case alone(SubscriptionRecord)

    var key: String {
        switch self {
        case .alone(let s):
            guard let k = s.cacheKey else { preconditionFailure("a key table entry that is not a key subscription") }
            return k
        case .shared(let v):
            return v.key
        }
    }

    var tableName: String { key }

    var hasSeveral: Bool {
        if case .shared(let v) = self { return v.hasSeveral }
        return false
    }

    @inline(__always)
    func forEach(_ body: (SubscriptionRecord) -> Void) {
        switch self {
        case .alone(let s): body(s)
        case .shared(let v): v.forEach(body)
        }
    }

    @inline(__always)
    func forEachUnretained(_ body: (SubscriptionRecord) -> Void) {
        switch self {
        case .alone(let s): body(s)
        case .shared(let v): v.forEachUnretained(body)
        }
    }
}

/// What a view's events go to: its subscribers in order, and whether there are several.
protocol SubscriberList {
    var hasSeveral: Bool { get }
    func forEach(_ body: (SubscriptionRecord) -> Void)
    func forEachUnretained(_ body: (SubscriptionRecord) -> Void)
}

extension SharedView: SubscriberList {}
extension KeySubscribers: SubscriberList {}

/// All subscriptions of one collection share one view: running subscribers
/// always hold the server's list as of the last mutation, so one encoded
/// change list serves them all.
final class CollectionView: SharedView {
    let name: String

    init(name: String) { self.name = name }
}

/// The `ids` subscriptions watching one entity: by subscription (add and
/// remove in O(1)), and in the order its events go out (PROTOCOL §6: by
/// connection, then name), sorted when an event first needs it after the
/// set changed and kept until it changes again — not sorted on every event
/// (at 100 watchers that sort was most of an entity event's cost). A value
/// in the engine's table (no object of its own); one watcher needs no list.
struct EntityWatchers {
    private(set) var byIdentity: [ObjectIdentifier: SubscriptionRecord] = [:]
    private var sorted: [SubscriptionRecord]? = nil

    var isEmpty: Bool { byIdentity.isEmpty }
    var count: Int { byIdentity.count }

    subscript(_ key: ObjectIdentifier) -> SubscriptionRecord? { byIdentity[key] }

    mutating func add(_ s: SubscriptionRecord) {
        byIdentity[ObjectIdentifier(s)] = s
        sorted = nil
    }

    mutating func remove(_ s: SubscriptionRecord) {
        if byIdentity.removeValue(forKey: ObjectIdentifier(s)) != nil { sorted = nil }
    }

    /// The watcher, when there is exactly one.
    var only: SubscriptionRecord? { byIdentity.count == 1 ? byIdentity.first?.value : nil }

    /// Every watcher in event order (sorted now if the set changed since the last call).
    mutating func ordered() -> [SubscriptionRecord] {
        if let sorted { return sorted }
        let list = Engine.ordered(byIdentity.values)
        sorted = list
        return list
    }
}
