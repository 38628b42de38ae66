public import ConcordJSON
import Foundation

/// The changes of one update of a query provider's window, with the count
/// of matching entities, the context of the mutation and the window they lead to.
public struct QueryProviderUpdate<Model: Sendable>: Sendable {
    /// In order; each index is valid against the window the previous change left.
    public var changes: [CollectionChange]
    /// How many entities match (window or not).
    public var count: Int
    /// The `context` of the mutation that made these changes.
    public var context: JSON?
    /// `data` right after these changes.
    public var data: [Model]
    /// Set on the last update when the server ended the query with an error
    /// (`limit_exceeded`: the live queries together grew past the server's
    /// `--max-query-entities`); the window is then empty and ``QueryDataProvider/changes`` ends.
    public var error: ConcordError? = nil
    /// True while pending optimistic layers (``ConcordClient/optimistic(_:_:)``) shape `data`.
    public var optimistic: Bool = false
}

/// A live query's window as typed models (PROTOCOL.md §3.1): the entities
/// of one type that match a condition, sorted, with an offset and a limit.
/// The server maintains the window for every process on the host and sends
/// index changes; this provider applies them, so a table view can animate
/// ``changes`` directly.
///
/// ```swift
/// let q = ConcordQuery(Post.self, where: .eq("author.id", "Person:7"), order: [.descending("date")], limit: 20)
/// let posts = try await QueryDataProvider<Post>.open(client: client, query: q)
/// for await update in posts.changes { table.apply(update.changes); badge = update.count }
/// ```
///
/// Read-only: write the entities themselves (any provider, `update`, …) and
/// the query follows. Renaming the `Person` that posts sort by moves them.
public final class QueryDataProvider<Model: ConcordModel>: @unchecked Sendable, LayerObserver {
    // Sendable: state guarded by `lock`; events arrive on the reader thread.
    /// The connection this provider subscribes through.
    public let client: ConcordClient
    /// The query whose window this provider holds.
    public let query: ConcordQuery
    private let lock = NSLock()
    private var items: [JSON] = []
    private var models: [Model] = []
    /// The window with the client's pending optimistic layers on top, while
    /// they change it (items are replaced in place, not re-sorted; the
    /// server's next event places them).
    private var layered: [JSON]?
    private var matching = 0
    private var subscription: Subscription?
    private var failure: ConcordError?

    /// Why the server ended this query, when it did (see ``QueryProviderUpdate/error``).
    public var error: ConcordError? { lock.withLock { failure } }
    private let continuation: AsyncStream<QueryProviderUpdate<Model>>.Continuation

    /// Every change of the window (and of the count), in order.
    public let changes: AsyncStream<QueryProviderUpdate<Model>>

    private init(client: ConcordClient, query: ConcordQuery) {
        self.client = client
        self.query = query
        (changes, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        client.layers.observe(self)
    }

    /// Subscribes and starts with the current window.
    public static func open(client: ConcordClient, query: ConcordQuery) async throws -> QueryDataProvider {
        let p = QueryDataProvider(client: client, query: query)
        let sub = try await client.subscribe(.query(query), name: nil) { [weak p] event in p?.handle(event) }
        p.lock.withLock {
            p.subscription = sub
            p.items = sub.initial.arrayValue ?? []
            p.models = p.items.compactMap { try? ModelCoding.model(Model.self, from: $0) }
            p.matching = sub.count ?? p.items.count
        }
        return p
    }

    deinit {
        client.layers.forget(self)
        continuation.finish()
        if let s = subscription { Task { try? await s.cancel() } }
    }

    /// Stops following the query; `changes` finishes.
    public func close() async {
        let sub = lock.withLock { () -> Subscription? in
            let s = subscription
            subscription = nil
            return s
        }
        try? await sub?.cancel()
        continuation.finish()
    }

    /// The window, in order.
    public var data: [Model] { lock.withLock { models } }
    /// How many entities match, window or not.
    public var count: Int { lock.withLock { matching } }
    /// The model at `index` of the window.
    public subscript(index: Int) -> Model { lock.withLock { models[index] } }

    /// Pauses or resumes the window; on resume one `.reset` brings it up to date.
    public func setPaused(_ paused: Bool) async throws {
        guard let sub = lock.withLock({ subscription }) else { return }
        if paused { try await sub.pause() } else { try await sub.resume() }
    }

    // MARK: Events (reader thread)

    private func decode(_ item: JSON) -> Model? { try? ModelCoding.model(Model.self, from: item) }

    private func handle(_ event: ConcordEvent) {
        lock.withLock {
            var out: [CollectionChange] = []
            var ctx: JSON?
            switch event {
            case .query(_, let edits, let count, let context):
                ctx = context
                matching = count
                for edit in edits {
                    guard edit.apply(to: &items) else {
                        // Cannot happen with a conforming server; recover with the whole window.
                        out = [.reset]
                        Task { [weak self] in await self?.reload() }
                        break
                    }
                    switch edit {
                    case .insert(let i, let list):
                        let decoded = list.compactMap(decode)
                        models.insert(contentsOf: decoded, at: min(i, models.count))
                        for k in 0..<decoded.count { out.append(.insert(i + k)) }
                    case .remove(let i, let n):
                        models.removeSubrange(min(i, models.count)..<min(i + n, models.count))
                        for _ in 0..<n { out.append(.delete(i)) }
                    case .update(let i, let item):
                        if i < models.count, let m = decode(item) { models[i] = m }
                        out.append(.update(i))
                    case .reset(let list):
                        models = list.compactMap(decode)
                        out.append(.reset)
                    }
                }
            case .resynced(_, let state):
                items = state["items"]?.arrayValue ?? []
                models = items.compactMap(decode)
                matching = state["count"]?.numberValue?.intValue ?? items.count
                out = [.reset]
            case .ended(_, let context):
                // `clear` ended the view: follow the query again under a new subscription.
                items = []
                models = []
                matching = 0
                ctx = context
                out = [.reset]
                subscription = nil
                Task { [weak self] in await self?.reopen() }
            case .failed(_, let error):
                // Ended by the server with an error: reopening would grow again.
                items = []
                models = []
                matching = 0
                subscription = nil
                failure = error
                continuation.yield(QueryProviderUpdate(changes: [.reset], count: 0, context: nil, data: [], error: error))
                continuation.finish()
                return
            case .update, .entities, .collection, .truncated:
                return
            }
            publish(out, ctx)
        }
    }

    private func reload() async {
        guard let (list, count, _) = try? await client.get(query: query) else { return }
        lock.withLock {
            items = list
            models = list.compactMap(decode)
            matching = count
            publish([.reset], nil)
        }
    }

    private func reopen() async {
        guard let sub = try? await client.subscribe(.query(query), name: nil, handler: { [weak self] event in self?.handle(event) }) else { return }
        lock.withLock {
            subscription = sub
            items = sub.initial.arrayValue ?? []
            models = items.compactMap(decode)
            matching = sub.count ?? items.count
            publish([.reset], nil)
        }
    }

    // MARK: Optimistic layers

    /// Publishes changes already applied to `items`/`models` (under `lock`);
    /// with layers pending that change the window, as one `.reset` of the
    /// window with the layers on top.
    private func publish(_ changes: [CollectionChange], _ context: JSON?) {
        switch client.layers.show(items, layered: &layered, event: true) {
        case .asIs:
            continuation.yield(QueryProviderUpdate(changes: changes, count: matching, context: context, data: models))
        case .same:
            models = (layered ?? items).compactMap(decode)
        case .reset(let shown):
            showReset(shown, context)
        }
    }

    private func showReset(_ shown: [JSON], _ context: JSON?) {
        models = shown.compactMap(decode)
        continuation.yield(QueryProviderUpdate(changes: [.reset], count: matching, context: context, data: models, optimistic: layered != nil))
    }

    func layersChanged() {
        lock.withLock {
            if case .reset(let shown) = client.layers.show(items, layered: &layered, event: false) { showReset(shown, nil) }
        }
    }
}
