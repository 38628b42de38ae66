import ConcordJSON

/// What a paused subscription remembers until it resumes — paused by its
/// client (`pause`), or held back because its connection is not reading fast
/// enough (PROTOCOL.md §6.6: coalescing). Both keep exactly what a `resume`
/// would send; a subscription can be both at once.
final class PauseState {
    /// Paused by the client's `pause`.
    var byUser = false
    /// Held back while its connection coalesces.
    var byCongestion = false
    /// Listed in its client's `coalesced` (changed while coalescing).
    var listed = false
    /// Set when the view changed while paused; `context` is then the context
    /// of the last such mutation (nil when it had none).
    var changed = false
    var context: JSON?
    /// Key views: the document last sent before the pause (nil: no document).
    var document: JSON?
    /// Collection and query views: the list (window) last sent before the pause.
    var items: [JSON] = []
    /// Query views: the count last sent before the pause.
    var count = 0
    /// `ids`/`feed` views: each entity changed while paused, with the value
    /// this subscription was last sent (null: absent), in order of first change.
    var entities: [String: JSON] = [:]
    var order: [String] = []
}

/// One client session as the core sees it.
final class Client {
    let id: ConnectionID
    var subs = NameTable<Subscription>()
    var output = OutputQueue()
    var dirty = false
    /// Lines read while an earlier request of this connection waits (read-through
    /// load, or a sync acknowledgement): answered in order once it is done.
    var backlog: [Engine.ParsedLine] = []
    var backlogHead = 0
    var waitingTicket: Int?
    var waitingDurable: Int?
    var heldResponse: (rid: JSON, bytes: [UInt8])?
    /// Shared with the driver: bytes it has not written yet, bytes it read that we did not take.
    let flow: ConnectionFlow
    /// Non-zero while this connection's events are coalesced (§6.6): the episode number.
    var coalescing = 0
    /// Subscriptions that changed while coalescing (each listed once).
    var coalesced: [Subscription] = []
    /// For the operator (`stats` with `clients`): the name from `hello`, the
    /// peer process, when the connection opened, requests answered.
    var name: String?
    var peer: PeerCredentials?
    var openedAt = 0.0
    var requests = 0

    init(id: ConnectionID, flow: ConnectionFlow) {
        self.id = id
        self.flow = flow
    }

    var isWaiting: Bool { waitingTicket != nil || waitingDurable != nil }

    func popBacklog() -> Engine.ParsedLine? {
        guard backlogHead < backlog.count else { return nil }
        let line = backlog[backlogHead]
        backlogHead += 1
        if backlogHead == backlog.count {
            backlog.removeAll(keepingCapacity: true)
            backlogHead = 0
        }
        return line
    }
}

/// A named view owned by one connection (PROTOCOL.md §3).
final class Subscription {
    enum Kind {
        case model(ModelView)
        case key(KeyView)
        case ids([String])
        case feed(types: Set<String>?)
        case collection(CollectionView)
        case query(QueryView)

        /// Position in ``Engine/subscriptionKindNames``.
        var metricIndex: Int {
            switch self {
            case .model: 0
            case .key: 1
            case .collection: 2
            case .ids: 3
            case .feed: 4
            case .query: 5
            }
        }
    }

    // Field order keeps the object at 64 bytes (a jemalloc size class): a
    // million subscriptions should not pay for padding.
    unowned(unsafe) let client: Client  // a client unregisters its subscriptions before it goes
    let name: String
    var kind: Kind
    /// True when `name` can be written between quotes as it is (the common case),
    /// so event headers need no escaping pass and no stored copy.
    let nameIsPlain: Bool
    /// Position in a shared view's subscriber list (key and collection subscriptions).
    var slot: Int32 = -1
    /// Present while paused. Kept out of line: most subscriptions never pause,
    /// and a million of them should not each carry this state.
    var pause: PauseState?

    var paused: Bool { pause != nil }

    init(client: Client, name: String, kind: Kind) {
        self.client = client
        self.name = name
        self.kind = kind
        self.nameIsPlain = name.utf8.allSatisfy { $0 >= 0x20 && $0 != 0x22 && $0 != 0x5C }
    }

    /// Writes the name as a JSON string.
    func writeName(_ w: inout JSONWriter) {
        if nameIsPlain {
            w.bytes.append(0x22)
            if name.utf8.withContiguousStorageIfAvailable({ w.bytes.append(contentsOf: $0) }) == nil {
                w.bytes.append(contentsOf: name.utf8)
            }
            w.bytes.append(0x22)
        } else {
            w.string(name)
        }
    }

    var typeName: String {
        switch kind {
        case .model: return "model"
        case .key: return "key"
        case .ids: return "ids"
        case .feed: return "feed"
        case .collection: return "collection"
        case .query: return "query"
        }
    }
}

/// A `model` subscription's private tree.
final class ModelView {
    unowned(unsafe) var sub: Subscription?
    var tree: JSON
    /// The value last sent (the subscribe response or the last event).
    var lastSent: JSON
    /// Every identity in `tree`: what this view watches.
    var ids: Set<String>

    init(tree: JSON, ids: Set<String>) {
        self.tree = tree
        self.lastSent = tree
        self.ids = ids
    }
}

/// The subscribers of a shared view, with O(1) removal (each subscription
/// remembers its slot). Most keys have one subscriber: it is kept inline,
/// and an array is only allocated for the second.
class SharedView {
    private var first: Subscription?
    private var rest: [Subscription] = []

    var isEmpty: Bool { first == nil }

    func forEach(_ body: (Subscription) -> Void) {
        guard let first else { return }
        body(first)
        for s in rest { body(s) }
    }

    func add(_ s: Subscription) {
        if first == nil {
            first = s
            s.slot = 0
        } else {
            rest.append(s)
            s.slot = Int32(rest.count)
        }
    }

    func remove(_ s: Subscription) {
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
/// mutation, so the view keeps no copy of it (48 bytes: one per watched key).
final class KeyView: SharedView {
    let key: String

    init(key: String) {
        self.key = key
    }
}

/// All subscriptions of one collection share one view: running subscribers
/// always hold the server's list as of the last mutation, so one encoded
/// change list serves them all.
final class CollectionView: SharedView {
    let name: String

    init(name: String) { self.name = name }
}
