public import ConcordJSON
import Foundation

/// A new value of a provider, with the context of the change that made it.
public struct ProviderUpdate<Model: Sendable>: Sendable {
    /// The new value (nil: the entity or document was deleted).
    public var model: Model?
    /// The `context` of the mutation that made it.
    public var context: JSON?
    /// True while pending optimistic layers (``ConcordClient/optimistic(_:_:)``) shape the value.
    public var optimistic: Bool = false
}

/// Holds one model and keeps it consistent with every other view of its
/// entities, like RocketData's `DataProvider`.
///
/// `data` is readable at any time without waiting. `setData` takes effect
/// locally at once and is sent as an `update` with this provider's
/// subscription as `origin`: every other holder is told, this one is not.
/// Changes made elsewhere arrive on ``updates``.
///
/// Calls on one provider should not overlap (as with RocketData, a provider
/// belongs to one owner).
public final class DataProvider<Model: ConcordModel>: @unchecked Sendable, LayerObserver {
    // Sendable: mutable state is guarded by `lock`; events are applied on the
    // client's reader thread, calls on the caller's task.
    /// The connection this provider subscribes and writes through.
    public let client: ConcordClient
    private let lock = NSLock()
    private var current: Model?
    /// The value as the server (or this provider's own write) has it, and as
    /// shown: with the client's pending optimistic layers on top.
    private var base: JSON?
    private var shown: JSON?
    /// RocketData's change clock: bumped by every `setData`, so a cache read
    /// that started before a newer write is discarded.
    private var clock = 0
    private var subscription: Subscription?
    private var paused = false
    private let continuation: AsyncStream<ProviderUpdate<Model>>.Continuation

    /// Values set by others (never this provider's own writes), newest last.
    public let updates: AsyncStream<ProviderUpdate<Model>>

    /// An empty provider; ``setData(_:context:)`` or a read gives it a model.
    public init(client: ConcordClient) {
        self.client = client
        (updates, continuation) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(16))
        client.layers.observe(self)
    }

    deinit {
        client.layers.forget(self)
        continuation.finish()
        if let s = subscription { Task { try? await s.cancel() } }
    }

    /// Stops following the model; `updates` finishes.
    public func close() async {
        let sub = lock.withLock { () -> Subscription? in
            let s = subscription
            subscription = nil
            return s
        }
        try? await sub?.cancel()
        continuation.finish()
    }

    /// The current value.
    public var data: Model? { lock.withLock { current } }

    /// True while paused: changes are not applied until it resumes (then it catches up at once).
    public var isPaused: Bool { lock.withLock { paused } }

    /// Sets the value locally at once, then tells the server (and so every
    /// other holder of its entities). `nil` just lets go of the model.
    public func setData(_ model: Model?, context: JSON? = nil) async throws {
        let json = try model.map { try ModelCoding.json($0) }
        lock.withLock {
            setBase(json)
            clock += 1
        }
        try await follow(model)
        guard let model, let sub = lock.withLock({ subscription }) else { return }
        try await client.update(try ModelCoding.json(model), context: context, origin: sub.name)
    }

    /// Reads the document stored under `key` and makes it the value, unless
    /// `setData` ran meanwhile (the newer local value wins). Returns what was read.
    @discardableResult
    public func fetchFromCache(key: String) async throws -> Model? {
        let started = lock.withLock { clock }
        let (json, _) = try await client.get(key: key)
        guard let json else { return nil }
        let model = try ModelCoding.model(Model.self, from: json)
        let fresh = lock.withLock { () -> Bool in
            guard clock == started else { return false }
            setBase(json)
            clock += 1
            return true
        }
        if fresh { try await follow(model) }
        return model
    }

    /// Pauses or resumes change delivery; on resume the latest value arrives once.
    public func setPaused(_ paused: Bool) async throws {
        guard let sub = lock.withLock({ subscription }) else {
            lock.withLock { self.paused = paused }
            return
        }
        if paused { try await sub.pause() } else { try await sub.resume() }
        lock.withLock { self.paused = paused }
    }

    /// Subscribes a model view of `model` (replacing the previous one).
    private func follow(_ model: Model?) async throws {
        let old = lock.withLock { () -> Subscription? in
            let o = subscription
            subscription = nil
            return o
        }
        if let old { try? await old.cancel() }
        guard let model else { return }
        let json = try ModelCoding.json(model)
        let sub = try await client.subscribe(.model(json), name: nil) { [weak self] event in
            self?.handle(event)
        }
        let wasPaused = lock.withLock { () -> Bool in
            subscription = sub
            return paused
        }
        if wasPaused { try await sub.pause() }
    }

    /// On the reader thread.
    private func handle(_ event: ConcordEvent) {
        let update: ProviderUpdate<Model>?
        switch event {
        case .update(_, let json, _, _, let context):
            update = lock.withLock {
                setBase(json)
                return ProviderUpdate(model: current, context: context, optimistic: shown != base)
            }
        case .resynced(_, let state):
            update = lock.withLock {
                setBase(state.isNull ? nil : state)
                return ProviderUpdate(model: current, context: nil, optimistic: shown != base)
            }
        case .ended(_, let context):
            update = lock.withLock {
                setBase(nil)
                subscription = nil
                return ProviderUpdate(model: current, context: context, optimistic: shown != base)
            }
        case .entities, .collection, .query, .failed, .truncated:  // only query views end with an error; only feeds are truncated
            update = nil
        }
        if let update { continuation.yield(update) }
    }

    // MARK: Optimistic layers

    /// Under `lock`: a new base value; what is shown follows with the layers on top.
    private func setBase(_ json: JSON?) {
        base = json
        shown = client.layers.apply(json)
        current = shown.flatMap { try? ModelCoding.model(Model.self, from: $0) }
    }

    /// The client's layers changed: show the base with the layers now pending.
    func layersChanged() {
        let update = lock.withLock { () -> ProviderUpdate<Model>? in
            let now = client.layers.apply(base)
            guard now != shown else { return nil }
            shown = now
            current = now.flatMap { try? ModelCoding.model(Model.self, from: $0) }
            return ProviderUpdate(model: current, context: nil, optimistic: now != base)
        }
        if let update { continuation.yield(update) }
    }
}
