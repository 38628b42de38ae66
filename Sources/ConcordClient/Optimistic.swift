public import ConcordJSON
import Foundation

/// A change shown at once by every provider of a client, before the server
/// has it (``ConcordClient/optimistic(_:_:)``).
public enum OptimisticChange: Sendable {
    /// The entity (an object with the identity member) as it will be: every
    /// occurrence of it in every provider shows this value.
    case update(JSON)
    /// The entity is gone: removed from lists, `null` where a member held it.
    case delete(id: String)
}

extension ConcordClient {
    /// Shows `changes` in every provider of this client at once, as a layer
    /// over the server's state, while `body` sends the real mutation(s) —
    /// the model of Apollo's `optimisticResponse` and Relay's
    /// `optimisticUpdater`.
    ///
    /// Server events that arrive meanwhile are applied underneath and the
    /// pending layers re-applied on top, so a provider only ever shows the
    /// server's state, or the server's state plus pending layers. When `body`
    /// returns, the server's events for its mutations have already been
    /// applied (a response comes after its events, PROTOCOL §6): the layer
    /// is dropped and the providers show the server's value. When `body`
    /// throws (a `conflict`, a refusal, a lost connection), the layer is
    /// dropped — the change rolls back — and the error is rethrown. Each step
    /// appears on the providers' update streams.
    ///
    /// ```swift
    /// let edited = ["id": "Post:7", "title": "New title"] as JSON
    /// try await client.optimistic([.update(edited)]) {
    ///     try await client.update(edited, merge: true, ifUnchangedSince: seen)
    /// }
    /// ```
    public func optimistic<T: Sendable>(_ changes: [OptimisticChange], _ body: () async throws -> T) async throws -> T {
        let id = layers.push(changes)
        do {
            let result = try await body()
            layers.pop(id)
            return result
        } catch {
            layers.pop(id)
            throw error
        }
    }
}

/// Something that shows values and re-applies the pending layers when they change.
protocol LayerObserver: AnyObject, Sendable {
    func layersChanged()
}

/// The pending optimistic layers of one client, oldest first, and the
/// providers that show them.
final class OptimisticLayers: @unchecked Sendable {
    // Sendable: everything behind `lock`; observers are told outside it.
    private let lock = NSLock()
    private var layers: [(id: Int, changes: [String: JSON?])] = []
    private var nextID = 1
    private var observers: [ObjectIdentifier: Weak] = [:]
    /// The server's identity member (from `hello`).
    private var key = "id"

    private struct Weak { weak var observer: (any LayerObserver)? }

    func setIDKey(_ k: String) { lock.withLock { key = k } }
    private func idKey() -> String { key }

    func observe(_ o: any LayerObserver) { lock.withLock { observers[ObjectIdentifier(o)] = Weak(observer: o) } }

    func forget(_ o: any LayerObserver) { _ = lock.withLock { observers.removeValue(forKey: ObjectIdentifier(o)) } }

    var isEmpty: Bool { lock.withLock { layers.isEmpty } }

    func push(_ changes: [OptimisticChange]) -> Int {
        let key = lock.withLock { idKey() }
        var map: [String: JSON?] = [:]
        for c in changes {
            switch c {
            case .update(let v):
                if let id = v.objectValue?[key]?.stringValue { map[id] = .some(v) }
            case .delete(let id):
                map[id] = .some(nil)
            }
        }
        let id = lock.withLock { () -> Int in
            defer { nextID += 1 }
            layers.append((nextID, map))
            return nextID
        }
        tell()
        return id
    }

    func pop(_ id: Int) {
        lock.withLock { layers.removeAll { $0.id == id } }
        tell()
    }

    private func tell() {
        let list = lock.withLock { observers.values.compactMap(\.observer) }
        for o in list { o.layersChanged() }
    }

    /// `value` with every pending layer applied, oldest first; nil when a layer deleted its root.
    func apply(_ value: JSON?) -> JSON? {
        let (all, key) = lock.withLock { (layers, idKey()) }
        guard !all.isEmpty, var v = value else { return value }
        for layer in all {
            guard let next = Self.apply(layer.changes, to: v, idKey: key) else { return nil }
            v = next
        }
        return v
    }

    /// What a list provider shows next (``show(_:layered:event:)``).
    enum ListShow {
        /// No layer touches the list: publish its changes as they are.
        case asIs
        /// What is shown did not change: publish nothing.
        case same
        /// Show this list (the base with the layers on top) as one `.reset`.
        case reset([JSON])
    }

    /// For a list provider whose base list is `items` and whose shown list
    /// is `layered` (nil: the base): after an event changed the base
    /// (`event`), or after the layers changed.
    func show(_ items: [JSON], layered: inout [JSON]?, event: Bool) -> ListShow {
        if event && layered == nil && isEmpty { return .asIs }
        let shown = apply(items)
        if layered == nil && shown == items { return event ? .asIs : .same }
        let before = layered ?? items
        layered = shown == items ? nil : shown
        return shown == before ? .same : .reset(shown)
    }

    /// A list with every pending layer applied to each item (deleted items leave).
    func apply(_ items: [JSON]) -> [JSON] {
        let (all, key) = lock.withLock { (layers, idKey()) }
        guard !all.isEmpty else { return items }
        var out = items
        for layer in all { out = out.compactMap { Self.apply(layer.changes, to: $0, idKey: key) } }
        return out
    }

    /// One layer on one value: an entity it names is replaced (or, deleted:
    /// nil at the root, `null` as a member, gone from an array).
    private static func apply(_ changes: [String: JSON?], to value: JSON, idKey: String) -> JSON? {
        switch value {
        case .object(var o):
            if let id = o[idKey]?.stringValue, let change = changes[id] {
                guard let replacement = change else { return nil }
                // The new value, with the layer applied to what it nests (not to itself again).
                guard case .object(var r) = replacement else { return replacement }
                for i in r.members.indices where r.members[i].key != idKey {
                    r.members[i].value = apply(changes, to: r.members[i].value, idKey: idKey) ?? .null
                }
                return .object(r)
            }
            for i in o.members.indices {
                o.members[i].value = apply(changes, to: o.members[i].value, idKey: idKey) ?? .null
            }
            return .object(o)
        case .array(let a):
            return .array(a.compactMap { apply(changes, to: $0, idKey: idKey) })
        default:
            return value
        }
    }
}
