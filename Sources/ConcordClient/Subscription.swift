public import ConcordJSON
import Foundation

/// What a subscription watches (PROTOCOL.md §3).
public enum SubscriptionTarget: Sendable {
    /// A private tree; `refresh` first replaces known entities by their current versions.
    case model(JSON, refresh: Bool = false)
    /// The document under a cache key.
    case key(String)
    /// An ordered collection.
    case collection(String)
    /// Each listed entity, present or not.
    case ids([String])
    /// Every entity change (of these types, when given).
    case feed(types: [String]? = nil)
    /// A live, sorted, windowed list of the entities matching a query (§3.1).
    case query(ConcordQuery)
}

/// One change of an `ids` or `feed` subscription: the entity's current value (nil: deleted).
public struct EntityChange: Sendable, Equatable {
    /// The entity's global identity.
    public var id: String
    /// Its current value; nil: deleted.
    public var model: JSON?
}

/// One step of a collection event; applied in order they take the previous list to the new one.
public enum CollectionEdit: Sendable, Equatable {
    /// `items` inserted at `index`.
    case insert(index: Int, items: [JSON])
    /// `count` items removed from `index`.
    case remove(index: Int, count: Int)
    /// The item at `index` has a new value (an entity it holds changed).
    case update(index: Int, item: JSON)
    /// The whole list, replacing what was there (after coalescing or a resync).
    case reset(items: [JSON])

    init?(json: JSON) {
        let index = json["index"]?.numberValue?.intValue ?? 0
        switch json["op"]?.stringValue {
        case "insert": self = .insert(index: index, items: json["items"]?.arrayValue ?? [])
        case "remove": self = .remove(index: index, count: json["count"]?.numberValue?.intValue ?? 1)
        case "update": self = .update(index: index, item: json["item"] ?? .null)
        case "reset": self = .reset(items: json["items"]?.arrayValue ?? [])
        default: return nil
        }
    }

    /// The wire form (`{"op":"insert","index":…,"items":[…]}`, …).
    public var json: JSON {
        switch self {
        case .insert(let i, let items): return ["op": "insert", "index": .int(i), "items": .array(items)]
        case .remove(let i, let n): return ["op": "remove", "index": .int(i), "count": .int(n)]
        case .update(let i, let item): return ["op": "update", "index": .int(i), "item": item]
        case .reset(let items): return ["op": "reset", "items": .array(items)]
        }
    }

    /// Applies this edit to a list; false (and the list untouched) when it does not fit.
    @discardableResult
    public func apply(to list: inout [JSON]) -> Bool {
        switch self {
        case .insert(let i, let items):
            guard i >= 0 && i <= list.count else { return false }
            list.insert(contentsOf: items, at: i)
        case .remove(let i, let n):
            guard i >= 0 && n >= 0 && i + n <= list.count else { return false }
            list.removeSubrange(i..<(i + n))
        case .update(let i, let item):
            guard i >= 0 && i < list.count else { return false }
            list[i] = item
        case .reset(let items):
            list = items
        }
        return true
    }
}

/// An event of one subscription. Events of one mutation arrive as one element.
public enum ConcordEvent: Sendable {
    /// A model or key view changed (`model` nil: the document is gone).
    case update(seq: Int, model: JSON?, changed: [String], deleted: [String], context: JSON?)
    /// `ids`/`feed`: the entities one mutation changed.
    case entities(seq: Int, [EntityChange], context: JSON?)
    /// A collection changed.
    case collection(seq: Int, [CollectionEdit], context: JSON?)
    /// A query's window or count changed: `count` entities match now.
    case query(seq: Int, [CollectionEdit], count: Int, context: JSON?)
    /// The view ended (its root, document or collection was removed, or `clear`).
    case ended(seq: Int, context: JSON?)
    /// The server ended the view with an error: a live query that grew past
    /// the server's `--max-query-entities` ends with `limit_exceeded`.
    /// Subscribing again to the same definition would only grow again:
    /// narrow the query.
    case failed(seq: Int, error: ConcordError)
    /// After a reconnection: the subscription is live again and this is its
    /// whole current state (`model`, `items` or `models`, as a subscribe
    /// answers; for a query `{"items":[…],"count":n}`).
    case resynced(seq: Int, state: JSON)
    /// After a reconnection, a `feed`: the server's change history no longer
    /// reaches back to the last event received, so changes in between were
    /// missed; the feed runs on from `seq`. Rebuild what depends on it
    /// another way (read it again).
    case truncated(seq: Int)

    /// The `seq` of the mutation this event shows (or the state is as of).
    public var seq: Int {
        switch self {
        case .update(let s, _, _, _, _), .entities(let s, _, _), .collection(let s, _, _), .query(let s, _, _, _), .ended(let s, _),
             .failed(let s, _), .resynced(let s, _), .truncated(let s):
            return s
        }
    }
}

/// The client's record of one live subscription.
final class SubscriptionState: @unchecked Sendable {
    // Sendable: `target`/`paused` are guarded by `lock`; the continuation is thread-safe.
    let name: String
    private let lock = NSLock()
    private var target: SubscriptionTarget
    private var paused = false
    /// The greatest seq of a response or event received for this view: a
    /// resubscription asks for what changed after it (`since`, §3.2).
    private var lastSeq = 0
    let continuation: AsyncStream<ConcordEvent>.Continuation
    /// When set, events go here, synchronously on the reader thread, instead
    /// of the stream (providers use it to apply events in exact order).
    let handler: (@Sendable (ConcordEvent) -> Void)?

    init(name: String, target: SubscriptionTarget, continuation: AsyncStream<ConcordEvent>.Continuation,
         handler: (@Sendable (ConcordEvent) -> Void)? = nil) {
        self.name = name
        self.target = target
        self.continuation = continuation
        self.handler = handler
    }

    /// While a resubscription's answer is on its way (``holdEvents()``), the
    /// events that follow it on the connection wait here: the answer is
    /// handled on a task, the events on the reader thread, and a newer event
    /// must not be applied before the older state it follows.
    private var held: [ConcordEvent]?
    /// Which hold `held` belongs to: a later hold replaces an earlier one,
    /// and only its owner releases or drops it.
    private var holdToken = 0

    /// Starts holding events; returns the hold's token.
    func holdEvents() -> Int {
        lock.withLock {
            held = []
            holdToken &+= 1
            return holdToken
        }
    }

    /// Ends the hold: `first` (the resubscription's outcome, if any), then the
    /// held events in order (a feed's replay, sent before the answer, and
    /// whatever followed the answer). A no-op when nothing is held.
    ///
    /// The hold lasts until everything it holds is delivered: an event the
    /// reader thread yields meanwhile joins the queue instead of overtaking
    /// (an insert applied before the resynced list it follows was lost when
    /// the list replaced it — seen once in CI, under load).
    func releaseHeld(_ token: Int, first: ConcordEvent? = nil) {
        guard lock.withLock({ token == holdToken && held != nil }) else { return }
        if let first { deliver(first) }
        while true {
            let batch = lock.withLock { () -> [ConcordEvent] in
                guard token == holdToken, let events = held else { return [] }
                held = events.isEmpty ? nil : []
                return events
            }
            if batch.isEmpty { return }
            for e in batch { deliver(e) }
        }
    }

    /// Ends the hold, dropping what it held (the resubscription failed: the
    /// next reconnection resynchronizes from scratch).
    func dropHeld(_ token: Int) { _ = takeHeld(token) }

    private func takeHeld(_ token: Int) -> [ConcordEvent]? {
        lock.withLock {
            guard token == holdToken, let events = held else { return nil }
            held = nil
            return events
        }
    }

    func yield(_ e: ConcordEvent) {
        let waits = lock.withLock { () -> Bool in
            guard held != nil else { return false }
            held!.append(e)
            return true
        }
        if !waits { deliver(e) }
    }

    private func deliver(_ e: ConcordEvent) {
        noteSeq(e.seq)
        // A model view's copy follows its events, so a resubscription starts from what we hold.
        if case .update(_, let model?, _, _, _) = e {
            lock.withLock { if case .model = target { target = .model(model, refresh: true) } }
        }
        if let handler { handler(e) } else { continuation.yield(e) }
    }

    func finish() { continuation.finish() }

    func noteSeq(_ seq: Int) { lock.withLock { lastSeq = max(lastSeq, seq) } }

    var seenSeq: Int { lock.withLock { lastSeq } }

    func noteResynced(_ value: JSON) {
        lock.withLock { if case .model = target, case .object = value { target = .model(value, refresh: true) } }
    }

    var targetSnapshot: SubscriptionTarget { lock.withLock { target } }

    var isPaused: Bool {
        get { lock.withLock { paused } }
        set { lock.withLock { paused = newValue } }
    }

    /// The `subscribe` request for this subscription (without `op`).
    func subscribeRequest(resync: Bool) -> JSONObject {
        var o = JSONObject()
        o["sub"] = .string(name)
        switch lock.withLock({ target }) {
        case .model(let m, let refresh):
            o["model"] = m
            if refresh || resync { o["refresh"] = true }
        case .key(let k): o["key"] = .string(k)
        case .collection(let c): o["collection"] = .string(c)
        case .ids(let ids): o["ids"] = .array(ids.map { .string($0) })
        case .feed(let types):
            var f = JSONObject()
            if let types { f["types"] = .array(types.map { .string($0) }) }
            o["feed"] = .object(f)
        case .query(let q): o["query"] = q.json
        }
        return o
    }
}

/// A live subscription: its first state, and its events as an async sequence.
///
/// Each subscription has its own buffer, so a slow consumer of one never
/// holds up another. Model and key views coalesce: a consumer that falls
/// behind gets the newest value, not a queue of stale ones. Collection,
/// `ids` and `feed` events are kept in full (their changes compose).
public final class Subscription: Sendable {
    /// The subscription's name on this connection (the `sub` member of its events).
    public let name: String
    /// The `seq` the first state is as of.
    public let seq: Int
    /// The first state: `model` (model/key views), `items` (collections and queries), `models` (ids), null (feed).
    public let initial: JSON
    /// Queries: how many entities matched at subscription (window or not); nil for other views.
    public let count: Int?
    /// Every event of this subscription, in `seq` order; finishes when it ends.
    public let events: AsyncStream<ConcordEvent>
    let client: ConcordClient

    /// True when subscribed with `since` and nothing the view shows changed
    /// after it: `initial` is null, the caller's copy is current.
    public let unchanged: Bool

    init(name: String, seq: Int, initial: JSON, count: Int? = nil, events: AsyncStream<ConcordEvent>, client: ConcordClient,
         unchanged: Bool = false) {
        self.unchanged = unchanged
        self.name = name
        self.seq = seq
        self.initial = initial
        self.count = count
        self.events = events
        self.client = client
    }

    /// Pauses delivery: the server keeps the view and coalesces its changes until ``resume()``.
    public func pause() async throws {
        _ = try await client.op("pause", [("sub", .string(name))])
        client.subscriptionState(name)?.isPaused = true
    }

    /// Resumes delivery: what changed while paused arrives as one event.
    public func resume() async throws {
        client.subscriptionState(name)?.isPaused = false
        _ = try await client.op("resume", [("sub", .string(name))])
    }

    /// Ends the subscription; its event stream finishes.
    public func cancel() async throws {
        let s = client.unregister(name)
        s?.finish()
        _ = try await client.op("unsubscribe", [("sub", .string(name))])
    }
}

extension ConcordClient {

    /// Subscribes; `name` defaults to a generated one. `keepEveryEvent`
    /// turns off coalescing for model and key views (their stream then keeps
    /// every event, as collection, ids and feed streams always do).
    ///
    /// With `since` (the seq of the last state the caller holds of this view,
    /// PROTOCOL §3.2), a view nothing of which changed after it answers
    /// ``Subscription/unchanged`` and no value; a feed first gets the entity
    /// changes after it replayed as events (or ``ConcordEvent/truncated(seq:)``
    /// when the server's history no longer reaches back).
    ///
    /// With `minSeq` (PROTOCOL §8.3) the subscription is answered once this
    /// server has applied through that seq (another host's write, in cluster
    /// mode), or throws `unavailable` after `timeoutMs` (server default 5 s).
    public func subscribe(_ target: SubscriptionTarget, name: String? = nil, keepEveryEvent: Bool = false,
                          since: Int? = nil, minSeq: Int? = nil, timeoutMs: Int? = nil) async throws -> Subscription {
        try await subscribe(target, name: name, handler: nil, keepEveryEvent: keepEveryEvent, since: since,
                            minSeq: minSeq, timeoutMs: timeoutMs)
    }

    /// Subscribes with events delivered to `handler` on the reader thread, in
    /// order, before any later response resumes its caller.
    func subscribe(_ target: SubscriptionTarget, name: String?, handler: (@Sendable (ConcordEvent) -> Void)?,
                   keepEveryEvent: Bool = false, since: Int? = nil, minSeq: Int? = nil, timeoutMs: Int? = nil) async throws -> Subscription {
        let name = name ?? generatedName("s")
        var coalesce: Bool
        switch target {
        case .model, .key: coalesce = true
        default: coalesce = false
        }
        if keepEveryEvent { coalesce = false }
        let (stream, continuation) = AsyncStream<ConcordEvent>.makeStream(
            bufferingPolicy: coalesce ? .bufferingNewest(1) : .unbounded)
        let state = SubscriptionState(name: name, target: target, continuation: continuation, handler: handler)
        // Registered before the request: events may follow the response at once.
        guard registerIfAbsent(state) else {
            continuation.finish()
            throw ConcordError(.subExists, "subscription '\(name)' already exists on this connection")
        }
        var o = state.subscribeRequest(resync: false)
        o["op"] = "subscribe"
        if let since { o["since"] = .int(since) }
        for (k, v) in Self.waitMembers(minSeq, timeoutMs) { if let v { o[k] = v } }
        do {
            let r = try await request(o)
            let seq = r["seq"]?.numberValue?.intValue ?? 0
            state.noteSeq(seq)
            let unchanged = r["unchanged"] == .bool(true)
            let initial = r["model"] ?? r["items"] ?? r["models"] ?? .null
            if case .model = target, !unchanged { state.noteResynced(initial) }
            if r["truncated"] == .bool(true) { state.yield(.truncated(seq: seq)) }
            return Subscription(name: name, seq: seq, initial: initial, count: r["count"]?.numberValue?.intValue,
                                events: stream, client: self, unchanged: unchanged)
        } catch {
            _ = unregister(name)
            continuation.finish()
            throw error
        }
    }
}
