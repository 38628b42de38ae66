public import ConcordJSON

/// One request line, decoded and checked for shape (PROTOCOL.md §3–§5).
/// State-dependent checks (does the subscription exist, ...) belong to the core.
public struct Request: Sendable {
    /// The request's `rid`, echoed in the response; `.null` when absent.
    public var rid: JSON
    /// What the request asks for.
    public var op: Operation
    /// `since` of a subscribe (§3.2): the seq the client's copy of the view is as of.
    public var since: Int?
    /// `min_seq` of `get`, `subscribe` and `ping` (§8.3): answered once this
    /// server has applied through that seq.
    public var minSeq: Int?
    /// `timeout_ms` of `sync` and of a request with `min_seq` (default 5 s).
    public var timeoutMs: Int?

    /// A decoded request.
    @inlinable
    public init(rid: JSON, op: Operation, since: Int? = nil, minSeq: Int? = nil, timeoutMs: Int? = nil) {
        self.rid = rid
        self.op = op
        self.since = since
        self.minSeq = minSeq
        self.timeoutMs = timeoutMs
    }

    /// The longest `token` a mutation may carry, in bytes (§4.1).
    public static let maxTokenBytes = 128
}

/// Every operation of PROTOCOL.md §2–§5, with its members decoded.
public enum Operation: Sendable {
    /// Introduces the client (its name, when given); answered with the server's facts.
    case hello(client: String?)
    /// Answered with the last `seq` after every event before it: a barrier.
    case ping
    /// Reads a value once, without subscribing.
    case get(GetTarget)
    /// Starts a named view on this connection.
    case subscribe(name: String, target: SubscribeTarget)
    /// Ends a view.
    case unsubscribe(name: String)
    /// Stops a view's events; its changes coalesce until `resume`.
    case pause(name: String)
    /// Restarts a paused view with one event for what changed.
    case resume(name: String)
    /// Reads, or replaces for the types given, the required members of entity types.
    case schema(required: [(type: String, members: [String])]?)
    /// `clients`: also list every connection (the operator's view);
    /// `prometheus`: also the metrics as Prometheus exposition text.
    case stats(clients: Bool, prometheus: Bool)
    /// A change: applied in the one total order, answered with its `seq`.
    case mutation(Mutation, MutationOptions)
    /// Answered once every mutation accepted before it is applied (§8.3);
    /// on a single server, at once.
    case sync
}

extension Operation {
    /// The wire names of the operations, in ``metricIndex`` order (the
    /// `op` label of the server's request counter).
    public static let metricNames = [
        "hello", "ping", "get", "subscribe", "unsubscribe", "pause", "resume", "schema", "stats",
        "update", "delete", "batch", "collection.set", "collection.insert", "collection.remove",
        "collection.delete", "clear", "sync",
    ]

    /// This operation's position in ``metricNames``.
    public var metricIndex: Int {
        switch self {
        case .hello: 0
        case .ping: 1
        case .get: 2
        case .subscribe: 3
        case .unsubscribe: 4
        case .pause: 5
        case .resume: 6
        case .schema: 7
        case .stats: 8
        case .sync: 17
        case .mutation(let m, _):
            switch m {
            case .update: 9
            case .deleteEntity, .deleteKey: 10
            case .batch: 11
            case .collectionSet: 12
            case .collectionInsert: 13
            case .collectionRemoveAt, .collectionRemoveIDs: 14
            case .collectionDelete: 15
            case .clear: 16
            }
        }
    }
}

/// What a `get` reads: a document, an entity, a query's window or a collection.
public enum GetTarget: Sendable {
    /// The document under a key.
    case key(String)
    /// The current value of an entity.
    case id(String)
    /// A query's window and count.
    case query(QuerySpec)
    case collection(String)
}

/// What a `subscribe` watches (PROTOCOL.md §3).
public enum SubscribeTarget: Sendable {
    /// A private tree, kept consistent; `refresh` first replaces known entities by their current versions.
    case model(JSON, refresh: Bool)
    case key(String)
    case collection(String)
    /// Each listed entity, present or not.
    case ids([String])
    /// Every entity change (of these types, when given).
    case feed(types: [String]?)
    /// A live query (§3.1).
    case query(QuerySpec)
}

/// Members every mutation may carry.
public struct MutationOptions: Sendable {
    /// `context`, delivered unchanged in every event; nil when absent.
    public var context: JSON?
    /// `origin`: the sender's subscription that is not told of this write.
    public var origin: String?
    /// `if_unchanged_since` (§4.1): applied only if nothing it writes changed after this seq.
    public var ifUnchangedSince: Int?
    /// `token` (§4.1): a retry with the same token is answered, not applied again.
    public var token: String?

    /// Options of one mutation.
    @inlinable
    public init(context: JSON? = nil, origin: String? = nil, ifUnchangedSince: Int? = nil, token: String? = nil) {
        self.context = context
        self.origin = origin
        self.ifUnchangedSince = ifUnchangedSince
        self.token = token
    }
}

/// How an `update` writes: `replace` the stored value, or `merge` members into it.
public enum UpdateMode: Sendable { case replace, merge }

/// A change to the store (PROTOCOL.md §4). Mutation+Encoding.swift writes it back to the wire.
public indirect enum Mutation: Sendable {
    /// Writes an entity (and every entity nested in it), or a document under `key`.
    case update(model: JSON, key: String?, mode: UpdateMode, force: Bool)
    /// Deletes an entity everywhere it appears.
    case deleteEntity(String)
    /// Deletes the document under a key.
    case deleteKey(String)
    /// Each op with its own `origin` (its `context` is ignored inside a batch).
    case batch([(Mutation, origin: String?)])
    /// Replaces a collection's items.
    case collectionSet(name: String, items: [JSON])
    /// Inserts items at an index (the end when nil).
    case collectionInsert(name: String, index: Int?, items: [JSON])
    /// Removes `count` items from an index.
    case collectionRemoveAt(name: String, index: Int, count: Int)
    /// Removes the items with these ids.
    case collectionRemoveIDs(name: String, ids: [String])
    /// Deletes a collection.
    case collectionDelete(name: String)
    /// Removes every entity, document and collection (the schema stays).
    case clear
}

extension Request {
    /// The `rid` of a request object, or nil when it cannot be echoed
    /// (an object or array).
    public static func rid(of object: JSONObject) -> JSON? {
        guard let rid = object["rid"] else { return .null }
        return rid.isScalar ? rid : nil
    }

    /// Decodes a parsed line. The error carries the code to answer with.
    public static func decode(_ value: JSON, idKey: String) throws(ProtocolError) -> Request {
        guard case .object(let object) = value else {
            throw ProtocolError(.parseError, "a request must be a JSON object")
        }
        guard let rid = rid(of: object) else {
            throw ProtocolError(.badRequest, "member 'rid' must be a scalar (string, number, boolean or null)")
        }
        let op = try decodeOperation(object, idKey: idKey)
        let r = Members(object)
        var request = Request(rid: rid, op: op)
        // Only the requests that take them look for them (a mutation, the
        // common request, pays nothing).
        switch op {
        case .subscribe:
            request.since = try r.optionalCount("since")
            request.minSeq = try r.optionalCount("min_seq")
            request.timeoutMs = try r.optionalCount("timeout_ms")
        case .get, .ping:
            request.minSeq = try r.optionalCount("min_seq")
            request.timeoutMs = try r.optionalCount("timeout_ms")
        case .sync:
            request.timeoutMs = try r.optionalCount("timeout_ms")
        default:
            break
        }
        return request
    }

    static let mutationOps: Set<String> = [
        "update", "delete", "collection.set", "collection.insert", "collection.remove", "collection.delete",
    ]

    static func decodeOperation(_ o: JSONObject, idKey: String) throws(ProtocolError) -> Operation {
        let r = Members(o)
        let name = try r.requiredString("op")
        // The most frequent op first: no walk through the names below, no hash.
        if name == "update" { return try decodeUpdate(o) }
        switch name {
        case "hello":
            return .hello(client: try r.optionalString("client"))
        case "ping":
            return .ping
        case "sync":
            return .sync
        case "stats":
            return .stats(clients: try r.optionalBool("clients") ?? false,
                          prometheus: try r.optionalBool("prometheus") ?? false)
        case "get":
            return .get(try decodeGet(r))
        case "subscribe":
            return .subscribe(name: try r.subName(), target: try decodeSubscribe(r, idKey: idKey))
        case "unsubscribe":
            return .unsubscribe(name: try r.subName())
        case "pause":
            return .pause(name: try r.subName())
        case "resume":
            return .resume(name: try r.subName())
        case "schema":
            return .schema(required: try decodeSchema(r))
        case "clear":
            return .mutation(.clear, try decodeOptions(r))
        case "batch":
            return .mutation(try decodeBatch(r, idKey: idKey), try decodeOptions(r))
        default:
            if mutationOps.contains(name) {
                return .mutation(try decodeMutation(name, r, idKey: idKey), try decodeOptions(r))
            }
            throw ProtocolError(.unknownOp, "unknown op '\(clip(name))'")
        }
    }

    static func decodeOptions(_ r: Members) throws(ProtocolError) -> MutationOptions {
        try options(token: r.object["token"], context: r.object["context"], origin: r.object["origin"],
                    ifUnchangedSince: r.object["if_unchanged_since"])
    }

    static func options(token t: JSON?, context: JSON?, origin: JSON?, ifUnchangedSince: JSON?) throws(ProtocolError) -> MutationOptions {
        // Most mutations carry none (~350 instructions through the checks below).
        if case .none = t, case .none = context, case .none = origin, case .none = ifUnchangedSince { return MutationOptions() }
        let token = try Members.optionalString(t, "token")
        if let token, token.utf8.count > Request.maxTokenBytes {
            throw ProtocolError(.badRequest, "member 'token' is \(token.utf8.count) bytes; at most \(Request.maxTokenBytes)")
        }
        return MutationOptions(context: context, origin: try Members.optionalSubName(origin, "origin"),
                               ifUnchangedSince: try Members.optionalCount(ifUnchangedSince, "if_unchanged_since"), token: token)
    }

    /// An `update` request, its members found in one pass over the object
    /// (the most frequent request: ten lookups by name were ten passes).
    /// Checks and errors are `decodeMutation`'s and `decodeOptions`'s, in
    /// their order; of a repeated name the parser kept the last value.
    static func decodeUpdate(_ o: JSONObject) throws(ProtocolError) -> Operation {
        var model: JSON?, key: JSON?, mode: JSON?, force: JSON?
        var token: JSON?, context: JSON?, origin: JSON?, ifUnchangedSince: JSON?
        for m in o.members {
            let k = m.key
            switch k.utf8.count {
            case 3: if sameText(k, "key") { key = m.value }
            case 4: if sameText(k, "mode") { mode = m.value }
            case 5:
                if sameText(k, "model") { model = m.value }
                else if sameText(k, "force") { force = m.value }
                else if sameText(k, "token") { token = m.value }
            case 6: if sameText(k, "origin") { origin = m.value }
            case 7: if sameText(k, "context") { context = m.value }
            case 18: if sameText(k, "if_unchanged_since") { ifUnchangedSince = m.value }
            default: break
            }
        }
        let mutation = try update(model: model, key: key, mode: mode, force: force)
        return .mutation(mutation, try options(token: token, context: context, origin: origin, ifUnchangedSince: ifUnchangedSince))
    }

    static func update(model: JSON?, key k: JSON?, mode m: JSON?, force f: JSON?) throws(ProtocolError) -> Mutation {
        guard let model else { throw ProtocolError(.badRequest, "update needs member 'model'") }
        guard case .object = model else { throw ProtocolError(.badRequest, "member 'model' must be an object") }
        let key = try Members.optionalString(k, "key")
        var mode = UpdateMode.replace
        if let m = try Members.optionalString(m, "mode") {
            switch m {
            case "replace": mode = .replace
            case "merge": mode = .merge
            default: throw ProtocolError(.badRequest, "member 'mode' must be \"replace\" or \"merge\"")
            }
        }
        let force = try Members.optionalBool(f, "force") ?? false
        return .update(model: model, key: key, mode: mode, force: force)
    }

    static func decodeGet(_ r: Members) throws(ProtocolError) -> GetTarget {
        let key = try r.optionalString("key")
        let id = try r.optionalIdentity("id")
        let collection = try r.optionalString("collection")
        var query: QuerySpec?
        if let q = r.object["query"], !q.isNull { query = try QuerySpec.decode(q) }
        let given = [key != nil, id != nil, collection != nil, query != nil].filter { $0 }.count
        guard given == 1 else {
            throw ProtocolError(.badRequest, given == 0 ? "get needs one of 'key', 'id', 'collection' or 'query'"
                                                        : "get takes only one of 'key', 'id', 'collection' or 'query'")
        }
        if let key { return .key(key) }
        if let id { return .id(id) }
        if let collection { return .collection(collection) }
        return .query(query!)
    }

    static func decodeSubscribe(_ r: Members, idKey: String) throws(ProtocolError) -> SubscribeTarget {
        var targets: [SubscribeTarget] = []
        var names: [String] = []
        if let m = r.object["model"] {
            guard case .object = m else { throw ProtocolError(.badRequest, "member 'model' must be an object") }
            targets.append(.model(m, refresh: try r.optionalBool("refresh") ?? false))
            names.append("model")
        }
        if let k = try r.optionalString("key") { targets.append(.key(k)); names.append("key") }
        if let c = try r.optionalString("collection") { targets.append(.collection(c)); names.append("collection") }
        if let ids = r.object["ids"] {
            guard case .array(let list) = ids else { throw ProtocolError(.badRequest, "member 'ids' must be an array of identities") }
            var out: [String] = []
            out.reserveCapacity(list.count)
            for (i, v) in list.enumerated() {
                guard let id = identityText(v) else {
                    throw ProtocolError(.badRequest, "ids[\(i)] must be a non-empty string or an integer")
                }
                out.append(id)
            }
            targets.append(.ids(out))
            names.append("ids")
        }
        if let f = r.object["feed"] {
            guard case .object(let fo) = f else { throw ProtocolError(.badRequest, "member 'feed' must be an object") }
            var types: [String]? = nil
            if let t = fo["types"], !t.isNull {
                guard case .array(let list) = t else { throw ProtocolError(.badRequest, "feed.types must be an array of strings") }
                var out: [String] = []
                for (i, v) in list.enumerated() {
                    guard case .string(let s) = v else { throw ProtocolError(.badRequest, "feed.types[\(i)] must be a string") }
                    out.append(s)
                }
                types = out
            }
            targets.append(.feed(types: types))
            names.append("feed")
        }
        if let q = r.object["query"], !q.isNull {
            targets.append(.query(try QuerySpec.decode(q)))
            names.append("query")
        }
        if targets.isEmpty {
            throw ProtocolError(.badRequest, "subscribe needs one of 'model', 'key', 'collection', 'ids', 'feed' or 'query'")
        }
        if targets.count > 1 {
            throw ProtocolError(.badRequest, "subscribe takes exactly one of 'model', 'key', 'collection', 'ids', 'feed' or 'query' (got \(names.joined(separator: ", ")))")
        }
        return targets[0]
    }

    static func decodeSchema(_ r: Members) throws(ProtocolError) -> [(type: String, members: [String])]? {
        guard let req = r.object["required"], !req.isNull else { return nil }
        guard case .object(let o) = req else { throw ProtocolError(.badRequest, "member 'required' must be an object of type → member names") }
        var out: [(type: String, members: [String])] = []
        for m in o.members {
            guard case .array(let list) = m.value else {
                throw ProtocolError(.badRequest, "required.\(clip(m.key)) must be an array of member names")
            }
            var names: [String] = []
            for (i, v) in list.enumerated() {
                guard case .string(let s) = v, !s.isEmpty else {
                    throw ProtocolError(.badRequest, "required.\(clip(m.key))[\(i)] must be a non-empty string")
                }
                names.append(s)
            }
            out.append((m.key, names))
        }
        return out
    }

    static func decodeBatch(_ r: Members, idKey: String) throws(ProtocolError) -> Mutation {
        guard let ops = r.object["ops"] else { throw ProtocolError(.badRequest, "batch needs member 'ops'") }
        guard case .array(let list) = ops else { throw ProtocolError(.badRequest, "member 'ops' must be an array of mutations") }
        var out: [(Mutation, origin: String?)] = []
        out.reserveCapacity(list.count)
        for (i, item) in list.enumerated() {
            do throws(ProtocolError) {
                guard case .object(let o) = item else { throw ProtocolError(.badRequest, "must be an object") }
                let m = Members(o)
                let name = try m.requiredString("op")
                if o["rid"] != nil { throw ProtocolError(.badRequest, "an op inside a batch cannot carry 'rid'") }
                guard mutationOps.contains(name) else {
                    let known: Set<String> = ["hello", "ping", "stats", "get", "subscribe", "unsubscribe", "pause", "resume", "schema", "clear", "batch"]
                    if known.contains(name) {
                        throw ProtocolError(.badRequest, "'\(name)' is not allowed in a batch (only update, delete and collection.*)")
                    }
                    throw ProtocolError(.unknownOp, "unknown op '\(clip(name))'")
                }
                out.append((try decodeMutation(name, m, idKey: idKey), try m.optionalSubName("origin")))
            } catch {
                throw error.prefixed("ops[\(i)]")
            }
        }
        return .batch(out)
    }

    static func decodeMutation(_ name: String, _ r: Members, idKey: String) throws(ProtocolError) -> Mutation {
        switch name {
        case "update":
            let o = r.object
            return try update(model: o["model"], key: o["key"], mode: o["mode"], force: o["force"])
        case "delete":
            let id = try r.optionalIdentity("id")
            let key = try r.optionalString("key")
            switch (id, key) {
            case (let i?, nil): return .deleteEntity(i)
            case (nil, let k?): return .deleteKey(k)
            case (nil, nil): throw ProtocolError(.badRequest, "delete needs 'id' or 'key'")
            default: throw ProtocolError(.badRequest, "delete takes 'id' or 'key', not both")
            }
        case "collection.set":
            return .collectionSet(name: try r.collectionName(), items: try r.items())
        case "collection.insert":
            let name = try r.collectionName()
            let index = try r.optionalInt("index")
            return .collectionInsert(name: name, index: index, items: try r.items())
        case "collection.remove":
            let name = try r.collectionName()
            let index = try r.optionalInt("index")
            let idsValue = r.object["ids"]
            if let index {
                if idsValue != nil { throw ProtocolError(.badRequest, "collection.remove takes 'index' or 'ids', not both") }
                let count = try r.optionalInt("count") ?? 1
                if count < 0 { throw ProtocolError(.badRequest, "member 'count' must not be negative") }
                return .collectionRemoveAt(name: name, index: index, count: count)
            }
            guard let idsValue else { throw ProtocolError(.badRequest, "collection.remove needs 'index' or 'ids'") }
            guard case .array(let list) = idsValue else { throw ProtocolError(.badRequest, "member 'ids' must be an array of identities") }
            var ids: [String] = []
            for (i, v) in list.enumerated() {
                guard let id = identityText(v) else { throw ProtocolError(.badRequest, "ids[\(i)] must be a non-empty string or an integer") }
                ids.append(id)
            }
            return .collectionRemoveIDs(name: name, ids: ids)
        case "collection.delete":
            return .collectionDelete(name: try r.collectionName())
        default:
            throw ProtocolError(.unknownOp, "unknown op '\(clip(name))'")
        }
    }

    /// An identity given as a request member: a non-empty string or an integer.
    public static func identityText(_ v: JSON) -> String? {
        switch v {
        case .string(let s): return s.isEmpty ? nil : s
        case .number(let n): return n.integerText
        default: return nil
        }
    }
}

/// Keeps user text in messages short.
func clip(_ s: String) -> String {
    s.count > 64 ? String(s.prefix(64)) + "…" : s
}

/// Typed member access with `bad_request` errors that name the member.
/// Each check is also a static function of the value found (or nil), so a
/// decoder that found its members in one pass (``Request/decodeUpdate``)
/// gives the same errors.
struct Members {
    let object: JSONObject
    init(_ object: JSONObject) { self.object = object }

    func requiredString(_ name: String) throws(ProtocolError) -> String {
        guard let v = object[name] else { throw ProtocolError(.badRequest, "missing member '\(name)'") }
        guard case .string(let s) = v else { throw ProtocolError(.badRequest, "member '\(name)' must be a string") }
        return s
    }

    func optionalString(_ name: String) throws(ProtocolError) -> String? { try Self.optionalString(object[name], name) }
    func optionalBool(_ name: String) throws(ProtocolError) -> Bool? { try Self.optionalBool(object[name], name) }
    func optionalCount(_ name: String) throws(ProtocolError) -> Int? { try Self.optionalCount(object[name], name) }
    func optionalSubName(_ name: String) throws(ProtocolError) -> String? { try Self.optionalSubName(object[name], name) }

    static func optionalString(_ v: JSON?, _ name: String) throws(ProtocolError) -> String? {
        guard let v, !v.isNull else { return nil }
        guard case .string(let s) = v else { throw ProtocolError(.badRequest, "member '\(name)' must be a string") }
        return s
    }

    static func optionalBool(_ v: JSON?, _ name: String) throws(ProtocolError) -> Bool? {
        guard let v, !v.isNull else { return nil }
        guard case .bool(let b) = v else { throw ProtocolError(.badRequest, "member '\(name)' must be true or false") }
        return b
    }

    /// A seq or a count: an integer ≥ 0.
    static func optionalCount(_ v: JSON?, _ name: String) throws(ProtocolError) -> Int? {
        guard let v, !v.isNull else { return nil }
        guard case .number(let n) = v, let i = n.intValue, i >= 0 else {
            throw ProtocolError(.badRequest, "member '\(name)' must be an integer ≥ 0")
        }
        return i
    }

    static func optionalSubName(_ v: JSON?, _ name: String) throws(ProtocolError) -> String? {
        guard let v, !v.isNull else { return nil }
        guard case .string(let s) = v, !s.isEmpty else { throw ProtocolError(.badRequest, "member '\(name)' must be a non-empty string") }
        return s
    }

    func optionalInt(_ name: String) throws(ProtocolError) -> Int? {
        guard let v = object[name], !v.isNull else { return nil }
        guard case .number(let n) = v, let i = n.intValue else {
            throw ProtocolError(.badRequest, "member '\(name)' must be an integer")
        }
        return i
    }

    func optionalIdentity(_ name: String) throws(ProtocolError) -> String? {
        guard let v = object[name], !v.isNull else { return nil }
        guard let id = Request.identityText(v) else {
            throw ProtocolError(.badRequest, "member '\(name)' must be a non-empty string or an integer")
        }
        return id
    }

    func subName() throws(ProtocolError) -> String {
        guard let v = object["sub"] else { throw ProtocolError(.badRequest, "missing member 'sub'") }
        guard case .string(let s) = v, !s.isEmpty else { throw ProtocolError(.badRequest, "member 'sub' must be a non-empty string") }
        return s
    }

    func collectionName() throws(ProtocolError) -> String {
        guard let v = object["collection"] else { throw ProtocolError(.badRequest, "missing member 'collection'") }
        guard case .string(let s) = v else { throw ProtocolError(.badRequest, "member 'collection' must be a string") }
        return s
    }

    func items() throws(ProtocolError) -> [JSON] {
        guard let v = object["items"] else { throw ProtocolError(.badRequest, "missing member 'items'") }
        guard case .array(let a) = v else { throw ProtocolError(.badRequest, "member 'items' must be an array") }
        return a
    }
}
