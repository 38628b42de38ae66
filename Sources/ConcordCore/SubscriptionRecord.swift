import ConcordJSON

/// A named view owned by one connection (PROTOCOL.md §3).
final class SubscriptionRecord {
    enum Kind {
        case model(ModelView)
        /// The cache key. The key's subscribers are found in the engine's
        /// key table (a shared ``KeyView`` only once there are two).
        case key(String)
        case ids([String])
        case feed(types: Set<String>?)
        case collection(CollectionView)
        case query(QueryWindow)

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
    // million subscriptions should not pay for padding. The pause state is
    // not a field (it would take the object to 80): see `pause`.
    unowned(unsafe) let client: ClientSession  // a client unregisters its subscriptions before it goes
    let name: String
    var kind: Kind
    /// True when `name` can be written between quotes as it is (the common case),
    /// so event headers need no escaping pass and no stored copy.
    let nameIsPlain: Bool
    /// Position in a shared view's subscriber list (key and collection
    /// subscriptions; -1 for a key's only subscription, which has no view).
    var slot: Int32 = -1

    /// Present while paused, kept by the client: most subscriptions never
    /// pause, and a million of them should not each carry a field for it.
    /// Whoever ends a subscription sets it to nil (the client's table is
    /// keyed by the object's identity, which a later object may reuse).
    var pause: PauseState? {
        get { client.pauses.isEmpty ? nil : client.pauses[ObjectIdentifier(self)] }
        set {
            if newValue == nil && client.pauses.isEmpty { return }
            client.pauses[ObjectIdentifier(self)] = newValue
        }
    }

    var paused: Bool { pause != nil }

    /// The cache key of a key subscription.
    var cacheKey: String? {
        if case .key(let k) = kind { return k }
        return nil
    }

    init(client: ClientSession, name: String, kind: Kind) {
        self.client = client
        self.name = name
        self.kind = kind
        self.nameIsPlain = name.utf8.allSatisfy { $0 >= 0x20 && $0 != 0x22 && $0 != 0x5C }
    }

    /// The name's length in UTF-8 bytes.
    @inline(__always)
    var nameCount: Int { name.utf8.count }

    /// Writes the name between quotes at `p` (`nameCount` + 2 bytes; a plain
    /// name needs no escaping) and returns where the next byte goes.
    @inline(__always)
    func copyQuotedName(to p: UnsafeMutableRawPointer, _ nameCount: Int) -> UnsafeMutableRawPointer {
        p.storeBytes(of: 0x22, as: UInt8.self)
        copyName(to: p + 1)
        (p + 1 + nameCount).storeBytes(of: 0x22, as: UInt8.self)
        return p + 2 + nameCount
    }

    /// Copies the name's UTF-8 (`nameCount` bytes) to `p`, borrowed from
    /// the record: not a copy of the string, which was a retain and a
    /// release per event of a fan-out.
    @inline(__always)
    func copyName(to p: UnsafeMutableRawPointer) {
        let done: Void? = name.utf8.withContiguousStorageIfAvailable { n in
            if let b = n.baseAddress { p.copyMemory(from: b, byteCount: n.count) }
        }
        if done == nil {
            var n = name
            n.withUTF8 { if let b = $0.baseAddress { p.copyMemory(from: b, byteCount: $0.count) } }
        }
    }

    /// Appends the name as a JSON string.
    func appendName(to bytes: inout [UInt8]) {
        if nameIsPlain {
            bytes.append(0x22)
            if name.utf8.withContiguousStorageIfAvailable({ bytes.append(contentsOf: $0) }) == nil {
                bytes.append(contentsOf: name.utf8)
            }
            bytes.append(0x22)
        } else {
            var w = JSONWriter(capacity: name.utf8.count + 8)
            w.string(name)
            bytes.append(contentsOf: w.bytes)
        }
    }

    /// Writes the name as a JSON string.
    func writeName(_ w: inout JSONWriter) {
        appendName(to: &w.bytes)
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
