import ConcordJSON

/// One client session as the core sees it.
final class Client {
    let id: ConnectionID
    var subs: [String: Subscription] = [:]
    var output = OutputQueue()
    var dirty = false

    init(id: ConnectionID) { self.id = id }
}

/// A named view owned by one connection (PROTOCOL.md §3).
final class Subscription {
    enum Kind {
        case model(ModelView)
        case key(KeyView)
        case ids([String])
        case feed(types: Set<String>?)
    }

    unowned let client: Client
    let name: String
    /// `{"event":"` is written by the caller; this is `","sub":"name","seq":`-ready name text.
    let encodedName: [UInt8]
    var kind: Kind
    /// Position in the key view's subscriber list (key subscriptions only).
    var slot = -1

    var paused = false
    /// Set when the view changed while paused; `pausedContext` is then the
    /// context of the last such mutation (nil when it had none).
    var changedWhilePaused = false
    var pausedContext: JSON?
    /// Key views: the document last sent before the pause (nil: no document).
    var pausedDocument: JSON?
    /// `ids`/`feed` views: each entity changed while paused, with the value
    /// this subscription was last sent (null: absent), in order of first change.
    var pausedEntities: [String: JSON] = [:]
    var pausedOrder: [String] = []

    init(client: Client, name: String, kind: Kind) {
        self.client = client
        self.name = name
        self.kind = kind
        var w = JSONWriter(capacity: name.utf8.count + 2)
        w.string(name)
        self.encodedName = w.bytes
    }

    var typeName: String {
        switch kind {
        case .model: return "model"
        case .key: return "key"
        case .ids: return "ids"
        case .feed: return "feed"
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

/// All `key` subscriptions of one cache key share one view: the document is
/// rendered and encoded once per mutation and the bytes go to every subscriber.
final class KeyView {
    let key: String
    /// The document as last sent to running subscribers (nil: none).
    var value: JSON?
    var subs: [Subscription] = []

    init(key: String, value: JSON?) {
        self.key = key
        self.value = value
    }

    func add(_ s: Subscription) {
        s.slot = subs.count
        subs.append(s)
    }

    func remove(_ s: Subscription) {
        let i = s.slot
        guard i >= 0, i < subs.count, subs[i] === s else { return }
        let last = subs.removeLast()
        if i < subs.count {
            subs[i] = last
            last.slot = i
        }
        s.slot = -1
    }
}
