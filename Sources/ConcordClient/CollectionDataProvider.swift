public import ConcordJSON
import Foundation

/// One change of a collection provider's `data`, in the order to apply them
/// (each index is valid against the list the previous change left), so a
/// table view can animate them one by one.
public enum CollectionChange: Sendable, Equatable {
    /// Reload everything.
    case reset
    case insert(Int)
    case delete(Int)
    case update(Int)
}

/// The changes of one update of `data`, with the context of the mutation
/// and the list they lead to.
public struct CollectionProviderUpdate<Model: Sendable>: Sendable {
    /// In order; each index is valid against the list the previous change left.
    public var changes: [CollectionChange]
    /// The `context` of the mutation that made these changes (nil for local writes and resets).
    public var context: JSON?
    /// `data` right after these changes.
    public var data: [Model]
    /// True while pending optimistic layers (``ConcordClient/optimistic(_:_:)``) shape `data`.
    public var optimistic: Bool = false
}

/// An ordered, shared list of models, like RocketData's `CollectionDataProvider`.
///
/// Every holder of the same collection sees the same list; writes take effect
/// locally at once and are sent with this provider as `origin`. Every change
/// of `data` — local writes, other writers' changes, entity updates,
/// deletions — appears on ``changes``, so applying that stream to a copy of
/// the list always gives `data`. When local and remote writes race, the
/// provider re-reads the list once its writes are acknowledged and sends a
/// `.reset` if it had diverged: it always converges to the server's list.
public final class CollectionDataProvider<Model: ConcordModel>: @unchecked Sendable, LayerObserver {
    // Sendable: state guarded by `lock`; events arrive on the reader thread.
    /// The connection this provider subscribes and writes through.
    public let client: ConcordClient
    /// The collection's name on the server.
    public let collection: String
    private let lock = NSLock()
    private var items: [JSON] = []
    /// What `data` shows: `items` decoded, with the client's pending
    /// optimistic layers on top while there are some (`layered`).
    private var models: [Model] = []
    private var layered: [JSON]?
    private var subscription: Subscription?
    private var inFlight = 0
    private var dirty = false
    private var resyncing = false
    private let continuation: AsyncStream<CollectionProviderUpdate<Model>>.Continuation

    /// Every change of `data`, in order.
    public let changes: AsyncStream<CollectionProviderUpdate<Model>>

    private init(client: ConcordClient, collection: String) {
        self.client = client
        self.collection = collection
        (changes, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        client.layers.observe(self)
    }

    /// Subscribes to `collection` and starts with its current items.
    public static func open(client: ConcordClient, collection: String) async throws -> CollectionDataProvider {
        let p = CollectionDataProvider(client: client, collection: collection)
        try await p.subscribe()
        return p
    }

    /// (Re)subscribes; a list that differs from what the provider holds becomes a `.reset`.
    private func subscribe() async throws {
        let sub = try await client.subscribe(.collection(collection), name: nil) { [weak self] event in
            self?.handle(event)
        }
        let initial = sub.initial.arrayValue ?? []
        lock.withLock {
            subscription = sub
            guard initial != items else { return }
            items = initial
            models = initial.compactMap { try? ModelCoding.model(Model.self, from: $0) }
            emit([.reset], nil)
        }
    }

    deinit {
        client.layers.forget(self)
        continuation.finish()
        if let s = subscription { Task { try? await s.cancel() } }
    }

    /// Stops following the collection; `changes` finishes.
    public func close() async {
        let sub = lock.withLock { () -> Subscription? in
            let s = subscription
            subscription = nil
            return s
        }
        try? await sub?.cancel()
        continuation.finish()
    }

    /// The list as this provider knows it now (never waits).
    public var data: [Model] { lock.withLock { models } }
    /// The number of models in ``data``.
    public var count: Int { lock.withLock { models.count } }
    /// The model at `index` of ``data``.
    public subscript(index: Int) -> Model { lock.withLock { models[index] } }

    // MARK: Writes (local at once, then the server)

    /// Replaces the whole list: locally at once, then `collection.set` on the server.
    public func setData(_ newModels: [Model], context: JSON? = nil) async throws {
        let json = try newModels.map(ModelCoding.json)
        lock.withLock {
            items = json
            models = newModels
            // As on the server: an identity written twice shows its last version everywhere.
            _ = mirrorEntityWrites(Array(zip(json, newModels)))
            emit([.reset], context)
        }
        try await write(context) { origin in
            try await self.client.collectionSet(self.collection, items: json, context: context, origin: origin)
        }
    }

    /// Inserts models at `index`: locally at once, then `collection.insert`.
    public func insert(_ newModels: [Model], at index: Int, context: JSON? = nil) async throws {
        let json = try newModels.map(ModelCoding.json)
        try lock.withLock { () throws in
            guard index >= 0 && index <= items.count else {
                throw ConcordError(.badIndex, "index \(index) is outside 0...\(items.count)")
            }
            items.insert(contentsOf: json, at: index)
            models.insert(contentsOf: newModels, at: index)
            let inserted: [CollectionChange] = (0..<newModels.count).map { .insert(index + $0) }
            emit(inserted + mirrorEntityWrites(Array(zip(json, newModels))), context)
        }
        try await write(context) { origin in
            try await self.client.collectionInsert(self.collection, items: json, at: index, context: context, origin: origin)
        }
    }

    /// Appends models at the end: locally at once, then `collection.insert` without an index.
    public func append(_ newModels: [Model], context: JSON? = nil) async throws {
        try await insert(newModels, at: count, context: context)
    }

    /// Replaces the item at `index`. The same identity is an update of that
    /// entity (every index holding it changes, here and everywhere); another
    /// identity swaps the item.
    public func update(_ model: Model, at index: Int, context: JSON? = nil) async throws {
        let json = try ModelCoding.json(model)
        let idKey = client.idKey
        let sameEntity = try lock.withLock { () throws -> Bool in
            guard index >= 0 && index < items.count else {
                throw ConcordError(.badIndex, "index \(index) is outside the list of \(items.count)")
            }
            let same = items[index].identity(idKey: idKey) == model.globalIdentity
            var changes: [CollectionChange] = []
            if same {
                for i in items.indices where items[i].identity(idKey: idKey) == model.globalIdentity {
                    items[i] = json
                    models[i] = model
                    changes.append(.update(i))
                }
            } else {
                items[index] = json
                models[index] = model
                changes.append(.update(index))
                changes += mirrorEntityWrites([(json, model)])
            }
            emit(changes, context)
            return same
        }
        try await write(context) { origin in
            if sameEntity {
                return try await self.client.update(json, context: context, origin: origin)
            }
            return try await self.client.batch([
                .collectionRemove(self.collection, at: index, count: 1),
                .collectionInsert(self.collection, items: [json], at: index),
            ], context: context, origin: origin)
        }
    }

    /// Removes `count` models from `index`: locally at once, then `collection.remove`.
    public func remove(at index: Int, count n: Int = 1, context: JSON? = nil) async throws {
        try lock.withLock { () throws in
            guard index >= 0 && n >= 1 && index + n <= items.count else {
                throw ConcordError(.badIndex, "cannot remove \(n) at \(index) from a list of \(items.count)")
            }
            items.removeSubrange(index..<(index + n))
            models.removeSubrange(index..<(index + n))
            emit(Array(repeating: .delete(index), count: n), context)
        }
        try await write(context) { origin in
            try await self.client.collectionRemove(self.collection, at: index, count: n, context: context, origin: origin)
        }
    }

    /// Items written by a collection mutation are updates of those entities:
    /// the server rewrites every other index holding them, and — this
    /// provider being the origin — does not tell us. Do the same locally.
    /// Call with `lock` held; returns the `update` changes it made.
    private func mirrorEntityWrites(_ written: [(JSON, Model)]) -> [CollectionChange] {
        var latest: [String: (JSON, Model)] = [:]
        for (j, m) in written { latest[m.globalIdentity] = (j, m) }
        let idKey = client.idKey
        var changes: [CollectionChange] = []
        for i in items.indices {
            guard let id = items[i].identity(idKey: idKey), let (j, m) = latest[id], items[i] != j else { continue }
            items[i] = j
            models[i] = m
            changes.append(.update(i))
        }
        return changes
    }

    /// Publishes changes already applied to `models`. Call with `lock` held, so
    /// the stream's order is the order the list changed in.
    private func emit(_ changes: [CollectionChange], _ context: JSON?) {
        // With optimistic layers pending (or just gone), `data` is the list
        // with the layers on top, and a change is shown as one `.reset`.
        switch client.layers.show(items, layered: &layered, event: true) {
        case .asIs:
            continuation.yield(CollectionProviderUpdate(changes: changes, context: context, data: models))
        case .same:
            models = (layered ?? items).compactMap { try? ModelCoding.model(Model.self, from: $0) }
        case .reset(let shown):
            showReset(shown, context)
        }
    }

    /// Under `lock`: `shown` becomes `data`, published as one `.reset`.
    private func showReset(_ shown: [JSON], _ context: JSON?) {
        models = shown.compactMap { try? ModelCoding.model(Model.self, from: $0) }
        continuation.yield(CollectionProviderUpdate(changes: [.reset], context: context, data: models, optimistic: layered != nil))
    }

    /// The client's layers changed: show the list with the layers now pending.
    func layersChanged() {
        lock.withLock {
            if case .reset(let shown) = client.layers.show(items, layered: &layered, event: false) { showReset(shown, nil) }
        }
    }

    /// Sends a write already applied locally (the caller applied and emitted it).
    /// Local writes take effect immediately and are counted in flight until acknowledged.
    private func write(_ context: JSON?, _ send: (String?) async throws -> Int) async throws {
        let origin = lock.withLock { () -> String? in
            inFlight += 1
            if resyncing { dirty = true }
            return subscription?.name
        }
        var failure: (any Error)?
        do { _ = try await send(origin) } catch { failure = error }
        let resync = lock.withLock { () -> Bool in
            inFlight -= 1
            if failure != nil { dirty = true }
            return dirty && inFlight == 0
        }
        if resync { try? await self.resynchronize() }
        if let failure { throw failure }
    }

    /// Waits until every event up to the server's current `seq` was applied,
    /// then compares with the server's list; a difference becomes one `.reset`.
    public func synchronize() async throws {
        _ = try await client.ping()
        try await resynchronize()
    }

    private func resynchronize() async throws {
        lock.withLock {
            resyncing = true
            dirty = false
        }
        let (server, _) = try await client.get(collection: collection)
        lock.withLock {
            resyncing = false
            guard server != items else { return }
            items = server
            models = server.compactMap { try? ModelCoding.model(Model.self, from: $0) }
            emit([.reset], nil)
        }
    }

    // MARK: Events (reader thread)

    private func handle(_ event: ConcordEvent) {
        var out: [CollectionChange] = []
        var context: JSON?
        var scheduleResync = false
        var reopen = false
        lock.withLock {
            defer { if !out.isEmpty { emit(out, context) } }
            switch event {
            case .collection(_, let edits, let ctx):
                context = ctx
                if inFlight > 0 { dirty = true }
                for e in edits {
                    guard e.apply(to: &items) else {
                        dirty = true
                        continue
                    }
                    switch e {
                    case .insert(let i, let new):
                        let decoded = new.compactMap { try? ModelCoding.model(Model.self, from: $0) }
                        if decoded.count == new.count, i <= models.count {
                            models.insert(contentsOf: decoded, at: i)
                            out += (0..<new.count).map { .insert(i + $0) }
                        } else {
                            dirty = true
                        }
                    case .remove(let i, let n):
                        if i + n <= models.count {
                            models.removeSubrange(i..<(i + n))
                            out += Array(repeating: .delete(i), count: n)
                        } else {
                            dirty = true
                        }
                    case .update(let i, let item):
                        if i < models.count, let m = try? ModelCoding.model(Model.self, from: item) {
                            models[i] = m
                            out.append(.update(i))
                        } else {
                            dirty = true
                        }
                    case .reset(let all):
                        models = all.compactMap { try? ModelCoding.model(Model.self, from: $0) }
                        out = [.reset]
                    }
                }
                scheduleResync = dirty && inFlight == 0 && !resyncing
            case .resynced(_, let state):
                items = state.arrayValue ?? []
                models = items.compactMap { try? ModelCoding.model(Model.self, from: $0) }
                out = [.reset]
            case .ended(_, let ctx):
                // The collection was dropped; it exists again from its next
                // insert, so follow it under a new subscription.
                items = []
                models = []
                out = [.reset]
                context = ctx
                subscription = nil
                reopen = true
            case .update, .entities, .query, .failed, .truncated:  // only query views end with an error; only feeds are truncated
                break
            }
        }
        if scheduleResync { Task { try? await self.resynchronize() } }
        if reopen { Task { try? await self.subscribe() } }
    }
}
