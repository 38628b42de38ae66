public import ConcordJSON
import ConcordProtocol

/// A mutation inside a ``ConcordClient/batch(_:context:origin:)``: the
/// same operations as the client's mutation calls, applied together.
///
/// Each case is one of PROTOCOL.md §4's mutations; its wire form comes from
/// `ConcordProtocol`'s `Mutation` (the one place that spells it).
public enum BatchOperation: Sendable {
    /// Writes an entity (or the document under `key`); `merge` merges it into
    /// the current value, `force` writes even when nothing changed; `origin`
    /// names this connection's subscription that is not told of the write.
    case update(JSON, key: String? = nil, merge: Bool = false, force: Bool = false, origin: String? = nil)
    /// Deletes an entity by id: every view holding it loses it.
    case delete(id: String)
    /// Deletes the document under a key.
    case deleteKey(String)
    /// Replaces a collection's items.
    case collectionSet(String, items: [JSON])
    /// Inserts items at `at` (the end when nil).
    case collectionInsert(String, items: [JSON], at: Int? = nil)
    /// Removes `count` items from index `at`.
    case collectionRemove(String, at: Int, count: Int = 1)
    /// Removes the items with these ids.
    case collectionRemoveIDs(String, ids: [String])
    /// Deletes a collection.
    case collectionDelete(String)

    /// The protocol's mutation and the origin this op carries inside the batch.
    var mutation: (Mutation, origin: String?) {
        switch self {
        case .update(let m, let key, let merge, let force, let origin):
            (.update(model: m, key: key, mode: merge ? .merge : .replace, force: force), origin)
        case .delete(let id): (.deleteEntity(id), nil)
        case .deleteKey(let k): (.deleteKey(k), nil)
        case .collectionSet(let c, let items): (.collectionSet(name: c, items: items), nil)
        case .collectionInsert(let c, let items, let index): (.collectionInsert(name: c, index: index, items: items), nil)
        case .collectionRemove(let c, let index, let count): (.collectionRemoveAt(name: c, index: index, count: count), nil)
        case .collectionRemoveIDs(let c, let ids): (.collectionRemoveIDs(name: c, ids: ids), nil)
        case .collectionDelete(let c): (.collectionDelete(name: c), nil)
        }
    }
}

extension ConcordClient {
    // MARK: Control

    /// `sync` (PROTOCOL §8.3): the seq this server has applied once every
    /// mutation accepted before the request is applied (on a single server, at once).
    @discardableResult
    public func sync(timeoutMs: Int? = nil) async throws -> Int {
        let r = try await op("sync", [("timeout_ms", timeoutMs.map { .int($0) })])
        return r["seq"]?.numberValue?.intValue ?? 0
    }

    /// Says `hello`: the server's name, version, protocol, identity member and limits (also done by ``connect(_:)`` and after every reconnect).
    @discardableResult
    public func hello() async throws -> ServerInfo {
        let r = try await op("hello", [("client", .string(configuration.clientName))])
        let info = ServerInfo(
            server: r["server"]?.stringValue ?? "",
            version: r["version"]?.stringValue ?? "",
            protocolVersion: r["protocol"]?.numberValue?.intValue ?? 0,
            idKey: r["id_key"]?.stringValue ?? "id",
            limits: r["limits"] ?? .null)
        noteServerInfo(info)
        return info
    }

    /// The last applied mutation; also a barrier: every event of every
    /// mutation up to it was delivered to this connection before it returns.
    /// With `minSeq` (PROTOCOL §8.3), answered once this server has applied
    /// through that seq (another host's write, in cluster mode), or
    /// ``ConcordError`` `unavailable` after `timeoutMs` (server default 5 s).
    @discardableResult
    public func ping(minSeq: Int? = nil, timeoutMs: Int? = nil) async throws -> Int {
        try await op("ping", Self.waitMembers(minSeq, timeoutMs))["seq"]?.numberValue?.intValue ?? 0
    }

    /// `min_seq` and `timeout_ms` for a read that waits for a seq (nil: not sent).
    static func waitMembers(_ minSeq: Int?, _ timeoutMs: Int?) -> [(String, JSON?)] {
        [("min_seq", minSeq.map { .int($0) }), ("timeout_ms", minSeq == nil ? nil : timeoutMs.map { .int($0) })]
    }

    /// The `stats` object; with `clients`, also `"clients"`: one object per
    /// connection (id, name, pid/uid/gid, age_ms, subscriptions, requests,
    /// unsent_bytes, unprocessed_bytes, coalescing, waiting).
    /// With `prometheus`, also `"prometheus"`: the server's metrics as
    /// Prometheus exposition text (see ``prometheusMetrics()``).
    public func stats(clients: Bool = false, prometheus: Bool = false) async throws -> JSONObject {
        var members: [(String, JSON?)] = []
        if clients { members.append(("clients", .bool(true))) }
        if prometheus { members.append(("prometheus", .bool(true))) }
        var r = try await op("stats", members)
        r["rid"] = nil
        r["ok"] = nil
        return r
    }

    /// The server's metrics in Prometheus's text format (what `--metrics`
    /// serves over HTTP), read over the socket.
    public func prometheusMetrics() async throws -> String {
        try await stats(prometheus: true)["prometheus"]?.stringValue ?? ""
    }

    /// Replaces the required members of the types given (`[]` drops a type); returns the whole schema.
    @discardableResult
    public func schema(_ required: [String: [String]]? = nil) async throws -> [String: [String]] {
        var members: [(String, JSON?)] = []
        if let required {
            var o = JSONObject()
            for (t, m) in required.sorted(by: { $0.key < $1.key }) { o[t] = .array(m.map { .string($0) }) }
            members.append(("required", .object(o)))
        }
        let r = try await op("schema", members)
        var out: [String: [String]] = [:]
        for m in r["required"]?.objectValue?.members ?? [] { out[m.key] = m.value.arrayValue?.compactMap { $0.stringValue } ?? [] }
        return out
    }

    // MARK: Reads
    //
    // Every read takes `minSeq` (PROTOCOL §8.3): answered once this server
    // has applied through that seq — e.g. the seq another host answered to a
    // write, in cluster mode — or ``ConcordError`` `unavailable` after
    // `timeoutMs` (server default 5 s).

    /// The document under `key` (nil when none) and the `seq` it is as of.
    public func get(key: String, minSeq: Int? = nil, timeoutMs: Int? = nil) async throws -> (model: JSON?, seq: Int) {
        let r = try await op("get", [("key", .string(key))] + Self.waitMembers(minSeq, timeoutMs))
        return (r["model"].flatMap { $0.isNull ? nil : $0 }, r["seq"]?.numberValue?.intValue ?? 0)
    }

    /// The current version of an entity (nil when unknown).
    public func get(id: String, minSeq: Int? = nil, timeoutMs: Int? = nil) async throws -> (model: JSON?, seq: Int) {
        let r = try await op("get", [("id", .string(id))] + Self.waitMembers(minSeq, timeoutMs))
        return (r["model"].flatMap { $0.isNull ? nil : $0 }, r["seq"]?.numberValue?.intValue ?? 0)
    }

    /// A collection's items (`[]` when it does not exist).
    public func get(collection: String, minSeq: Int? = nil, timeoutMs: Int? = nil) async throws -> (items: [JSON], seq: Int) {
        let r = try await op("get", [("collection", .string(collection))] + Self.waitMembers(minSeq, timeoutMs))
        return (r["items"]?.arrayValue ?? [], r["seq"]?.numberValue?.intValue ?? 0)
    }

    /// A query's window (current values), how many entities match, and the `seq` it is as of.
    public func get(query: ConcordQuery, minSeq: Int? = nil, timeoutMs: Int? = nil) async throws -> (items: [JSON], count: Int, seq: Int) {
        let r = try await op("get", [("query", query.json)] + Self.waitMembers(minSeq, timeoutMs))
        return (r["items"]?.arrayValue ?? [], r["count"]?.numberValue?.intValue ?? 0, r["seq"]?.numberValue?.intValue ?? 0)
    }

    // MARK: Mutations
    //
    // Every mutation returns its `seq`: its place in the server's one total
    // order. By the time it returns, every view this connection holds shows
    // it (events before responses, PROTOCOL.md §6). `context` is delivered
    // unchanged in every event the mutation causes; `origin` names one of
    // this connection's subscriptions that is not told of it (it already
    // knows). A mutation the server refuses throws ``ConcordError`` with the
    // server's code and applies nothing.

    /// Writes an entity, or a document under `key`.
    ///
    /// Every entity nested in `model` (an object with the identity member) is
    /// written too, and every view anywhere that holds one of them is
    /// rewritten and pushed. With `merge`, members of `model` are merged into
    /// the stored values instead of replacing them. An update that changes
    /// nothing is applied without events unless `force` is set.
    @discardableResult
    public func update(_ model: JSON, key: String? = nil, merge: Bool = false, force: Bool = false,
                       context: JSON? = nil, origin: String? = nil,
                       ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.update(model: model, key: key, mode: merge ? .merge : .replace, force: force), context: context, origin: origin,
                           ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Deletes an entity: it disappears from every document, collection and
    /// query that held it, and `ids` subscriptions see it deleted.
    @discardableResult
    public func delete(id: String, context: JSON? = nil, origin: String? = nil,
                       ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.deleteEntity(id), context: context, origin: origin,
                           ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Deletes the document under `key`; its subscribers see `null`.
    @discardableResult
    public func delete(key: String, context: JSON? = nil, origin: String? = nil,
                       ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.deleteKey(key), context: context, origin: origin,
                           ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Applies the ops atomically under one `seq`: all of them or, when one
    /// is refused, none. Each view sees one event for the whole batch.
    @discardableResult
    public func batch(_ ops: [BatchOperation], context: JSON? = nil, origin: String? = nil,
                       ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.batch(ops.map(\.mutation)), context: context, origin: origin,
                           ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Replaces the items of collection `name` (creating it).
    @discardableResult
    public func collectionSet(_ name: String, items: [JSON], context: JSON? = nil, origin: String? = nil,
                       ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.collectionSet(name: name, items: items), context: context, origin: origin,
                           ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Inserts items into collection `name` at `index` (appends when nil);
    /// subscribers get the index changes (PROTOCOL.md §5).
    @discardableResult
    public func collectionInsert(_ name: String, items: [JSON], at index: Int? = nil, context: JSON? = nil, origin: String? = nil,
                       ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.collectionInsert(name: name, index: index, items: items), context: context, origin: origin,
                           ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Removes `count` items of collection `name` starting at `index`.
    @discardableResult
    public func collectionRemove(_ name: String, at index: Int, count: Int = 1, context: JSON? = nil, origin: String? = nil,
                       ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.collectionRemoveAt(name: name, index: index, count: count), context: context, origin: origin,
                           ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Removes the items of collection `name` whose ids are listed.
    @discardableResult
    public func collectionRemove(_ name: String, ids: [String], context: JSON? = nil, origin: String? = nil,
                       ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.collectionRemoveIDs(name: name, ids: ids), context: context, origin: origin,
                           ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Deletes collection `name`; its subscribers see it end empty.
    @discardableResult
    public func collectionDelete(_ name: String, context: JSON? = nil, origin: String? = nil,
                       ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.collectionDelete(name: name), context: context, origin: origin,
                           ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Removes everything (the schema stays); every subscription everywhere ends.
    @discardableResult
    public func clear(context: JSON? = nil, ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        try await mutation(.clear, context: context, origin: nil, ifUnchangedSince: ifUnchangedSince, token: token)
    }

    /// Sends one mutation, encoded by `ConcordProtocol`, and returns its `seq`.
    ///
    /// Every mutation carries a token (`token`, else a new random one). When
    /// the connection drops before the answer, the client reconnects and
    /// sends the same request again with the same token: the server applies
    /// it at most once and answers the real outcome (PROTOCOL §4.1), for up
    /// to `configuration.retryTimeout`. With `ifUnchangedSince`, a write whose
    /// entities, keys or collections changed after that seq is refused with
    /// `conflict` (``ConcordError/conflict`` says what changed).
    func mutation(_ m: Mutation, context: JSON?, origin: String?, ifUnchangedSince: Int? = nil, token: String? = nil) async throws -> Int {
        var o = m.requestObject()
        MutationOptions(context: context, origin: origin, ifUnchangedSince: ifUnchangedSince,
                        token: token ?? Self.newToken()).encode(into: &o)
        let deadline = ContinuousClock.now + configuration.retryTimeout
        while true {
            let generation = connectionGeneration
            do {
                let r = try await request(o)
                return r["seq"]?.numberValue?.intValue ?? 0
            } catch let e as ConcordError where e.code == .disconnected {
                guard await waitForReconnect(after: generation, until: deadline) else { throw e }
            }
        }
    }

    /// 128 random bits as hex: unique enough that two clients never share one.
    static func newToken() -> String {
        var g = SystemRandomNumberGenerator()
        let a = g.next() as UInt64, b = g.next() as UInt64
        let hex = String(a, radix: 16) + "-" + String(b, radix: 16)
        return "c-" + hex
    }
}
