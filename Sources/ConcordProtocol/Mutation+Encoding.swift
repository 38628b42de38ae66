public import ConcordJSON

// The encoding side of the mutation vocabulary (PROTOCOL.md §4): the one
// place, beside the decoder in Request.swift, that spells the wire names of
// mutations and their members. The client SDK builds its requests from here,
// and a round-trip test holds the two directions together.

extension Mutation {
    /// The `op` of this mutation on the wire: `"update"`, `"delete"`,
    /// `"batch"`, `"collection.set"`, `"collection.insert"`,
    /// `"collection.remove"`, `"collection.delete"` or `"clear"`.
    public var opName: String {
        switch self {
        case .update: "update"
        case .deleteEntity, .deleteKey: "delete"
        case .batch: "batch"
        case .collectionSet: "collection.set"
        case .collectionInsert: "collection.insert"
        case .collectionRemoveAt, .collectionRemoveIDs: "collection.remove"
        case .collectionDelete: "collection.delete"
        case .clear: "clear"
        }
    }

    /// The request object for this mutation, `op` first, without `rid`,
    /// `context` or `origin` (``MutationOptions``); ``Request/decode(_:idKey:)``
    /// reads it back as the same mutation. Members at their default values
    /// (`"mode":"replace"`, `"force":false`, `"count":1`) are left out.
    public func requestObject() -> JSONObject {
        var o = JSONObject()
        o["op"] = .string(opName)
        switch self {
        case .update(let model, let key, let mode, let force):
            o["model"] = model
            if let key { o["key"] = .string(key) }
            if mode == .merge { o["mode"] = "merge" }
            if force { o["force"] = true }
        case .deleteEntity(let id):
            o["id"] = .string(id)
        case .deleteKey(let key):
            o["key"] = .string(key)
        case .batch(let ops):
            o["ops"] = .array(ops.map { op, origin in
                var member = op.requestObject()
                if let origin { member["origin"] = .string(origin) }
                return .object(member)
            })
        case .collectionSet(let name, let items):
            o["collection"] = .string(name)
            o["items"] = .array(items)
        case .collectionInsert(let name, let index, let items):
            o["collection"] = .string(name)
            o["items"] = .array(items)
            if let index { o["index"] = .int(index) }
        case .collectionRemoveAt(let name, let index, let count):
            o["collection"] = .string(name)
            o["index"] = .int(index)
            if count != 1 { o["count"] = .int(count) }
        case .collectionRemoveIDs(let name, let ids):
            o["collection"] = .string(name)
            o["ids"] = .array(ids.map { .string($0) })
        case .collectionDelete(let name):
            o["collection"] = .string(name)
        case .clear:
            break
        }
        return o
    }
}

extension MutationOptions {
    /// Adds `context` and `origin` (when set) to a request object.
    public func encode(into object: inout JSONObject) {
        if let context { object["context"] = context }
        if let origin { object["origin"] = .string(origin) }
        if let ifUnchangedSince { object["if_unchanged_since"] = .int(ifUnchangedSince) }
        if let token { object["token"] = .string(token) }
    }
}

extension Request {
    /// Every decoded part of the request written out in one fixed order
    /// (a mutation as its ``Mutation/requestObject()``): two requests are
    /// the same request when these texts are equal. For tests, fuzz targets
    /// and logs; not a wire form.
    public var decodedText: String {
        var o = JSONObject()
        o["rid"] = rid
        if case .mutation(let m, let options) = op {
            o["mutation"] = .object(m.requestObject())
            var opts = JSONObject()
            options.encode(into: &opts)
            o["options"] = .object(opts)
        } else {
            o["op"] = .string("\(op)")
        }
        if let since { o["since"] = .int(since) }
        if let minSeq { o["min_seq"] = .int(minSeq) }
        if let timeoutMs { o["timeout_ms"] = .int(timeoutMs) }
        var w = JSONWriter()
        w.value(.object(o))
        return String(decoding: w.bytes, as: UTF8.self)
    }
}
