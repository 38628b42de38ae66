public import ConcordJSON

/// A mutation inside a ``ConcordClient/batch(_:context:origin:)``.
public enum BatchOperation: Sendable {
    case update(JSON, key: String? = nil, merge: Bool = false, force: Bool = false, origin: String? = nil)
    case delete(id: String)
    case deleteKey(String)
    case collectionSet(String, items: [JSON])
    case collectionInsert(String, items: [JSON], at: Int? = nil)
    case collectionRemove(String, at: Int, count: Int = 1)
    case collectionRemoveIDs(String, ids: [String])
    case collectionDelete(String)

    var json: JSONObject {
        var o = JSONObject()
        switch self {
        case .update(let m, let key, let merge, let force, let origin):
            o["op"] = "update"
            o["model"] = m
            if let key { o["key"] = .string(key) }
            if merge { o["mode"] = "merge" }
            if force { o["force"] = true }
            if let origin { o["origin"] = .string(origin) }
        case .delete(let id):
            o["op"] = "delete"
            o["id"] = .string(id)
        case .deleteKey(let k):
            o["op"] = "delete"
            o["key"] = .string(k)
        case .collectionSet(let c, let items):
            o["op"] = "collection.set"
            o["collection"] = .string(c)
            o["items"] = .array(items)
        case .collectionInsert(let c, let items, let index):
            o["op"] = "collection.insert"
            o["collection"] = .string(c)
            o["items"] = .array(items)
            if let index { o["index"] = .int(index) }
        case .collectionRemove(let c, let index, let count):
            o["op"] = "collection.remove"
            o["collection"] = .string(c)
            o["index"] = .int(index)
            o["count"] = .int(count)
        case .collectionRemoveIDs(let c, let ids):
            o["op"] = "collection.remove"
            o["collection"] = .string(c)
            o["ids"] = .array(ids.map { .string($0) })
        case .collectionDelete(let c):
            o["op"] = "collection.delete"
            o["collection"] = .string(c)
        }
        return o
    }
}

extension ConcordClient {
    // MARK: Control

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
    @discardableResult
    public func ping() async throws -> Int {
        try await op("ping")["seq"]?.numberValue?.intValue ?? 0
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

    /// The document under `key` (nil when none) and the `seq` it is as of.
    public func get(key: String) async throws -> (model: JSON?, seq: Int) {
        let r = try await op("get", [("key", .string(key))])
        return (r["model"].flatMap { $0.isNull ? nil : $0 }, r["seq"]?.numberValue?.intValue ?? 0)
    }

    /// The current version of an entity (nil when unknown).
    public func get(id: String) async throws -> (model: JSON?, seq: Int) {
        let r = try await op("get", [("id", .string(id))])
        return (r["model"].flatMap { $0.isNull ? nil : $0 }, r["seq"]?.numberValue?.intValue ?? 0)
    }

    /// A collection's items (`[]` when it does not exist).
    public func get(collection: String) async throws -> (items: [JSON], seq: Int) {
        let r = try await op("get", [("collection", .string(collection))])
        return (r["items"]?.arrayValue ?? [], r["seq"]?.numberValue?.intValue ?? 0)
    }

    /// A query's window (current values), how many entities match, and the `seq` it is as of.
    public func get(query: ConcordQuery) async throws -> (items: [JSON], count: Int, seq: Int) {
        let r = try await op("get", [("query", query.json)])
        return (r["items"]?.arrayValue ?? [], r["count"]?.numberValue?.intValue ?? 0, r["seq"]?.numberValue?.intValue ?? 0)
    }

    // MARK: Mutations (each returns its seq)

    @discardableResult
    public func update(_ model: JSON, key: String? = nil, merge: Bool = false, force: Bool = false,
                       context: JSON? = nil, origin: String? = nil) async throws -> Int {
        try await mutation("update", [
            ("model", model), ("key", key.map { .string($0) }), ("mode", merge ? "merge" : nil),
            ("force", force ? true : nil),
        ], context: context, origin: origin)
    }

    @discardableResult
    public func delete(id: String, context: JSON? = nil, origin: String? = nil) async throws -> Int {
        try await mutation("delete", [("id", .string(id))], context: context, origin: origin)
    }

    @discardableResult
    public func delete(key: String, context: JSON? = nil, origin: String? = nil) async throws -> Int {
        try await mutation("delete", [("key", .string(key))], context: context, origin: origin)
    }

    /// Applies the ops atomically under one `seq`.
    @discardableResult
    public func batch(_ ops: [BatchOperation], context: JSON? = nil, origin: String? = nil) async throws -> Int {
        try await mutation("batch", [("ops", .array(ops.map { .object($0.json) }))], context: context, origin: origin)
    }

    @discardableResult
    public func collectionSet(_ name: String, items: [JSON], context: JSON? = nil, origin: String? = nil) async throws -> Int {
        try await mutation("collection.set", [("collection", .string(name)), ("items", .array(items))], context: context, origin: origin)
    }

    @discardableResult
    public func collectionInsert(_ name: String, items: [JSON], at index: Int? = nil, context: JSON? = nil, origin: String? = nil) async throws -> Int {
        try await mutation("collection.insert", [
            ("collection", .string(name)), ("items", .array(items)), ("index", index.map { .int($0) }),
        ], context: context, origin: origin)
    }

    @discardableResult
    public func collectionRemove(_ name: String, at index: Int, count: Int = 1, context: JSON? = nil, origin: String? = nil) async throws -> Int {
        try await mutation("collection.remove", [
            ("collection", .string(name)), ("index", .int(index)), ("count", .int(count)),
        ], context: context, origin: origin)
    }

    @discardableResult
    public func collectionRemove(_ name: String, ids: [String], context: JSON? = nil, origin: String? = nil) async throws -> Int {
        try await mutation("collection.remove", [("collection", .string(name)), ("ids", .array(ids.map { .string($0) }))],
                           context: context, origin: origin)
    }

    @discardableResult
    public func collectionDelete(_ name: String, context: JSON? = nil, origin: String? = nil) async throws -> Int {
        try await mutation("collection.delete", [("collection", .string(name))], context: context, origin: origin)
    }

    /// Removes everything (the schema stays); every subscription everywhere ends.
    @discardableResult
    public func clear(context: JSON? = nil) async throws -> Int {
        try await mutation("clear", [], context: context, origin: nil)
    }

    func mutation(_ name: String, _ members: [(String, JSON?)], context: JSON?, origin: String?) async throws -> Int {
        let r = try await op(name, members + [("context", context), ("origin", origin.map { .string($0) })])
        return r["seq"]?.numberValue?.intValue ?? 0
    }
}
