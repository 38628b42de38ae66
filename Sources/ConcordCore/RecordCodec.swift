public import ConcordJSON

/// What a cache backend stores, and how (docs/PLUGINS.md, "Records").
///
/// Keys: `e:<id>` an entity, `d:<key>` a document, `c:<name>` a collection,
/// `s:schema` the schema, `t:<token>` a mutation's idempotency token
/// (`{"v":1,"seq":n}`: the seq it was accepted with, PROTOCOL §4.1).
/// Records and collections carry `"s"`, the seq of their last change, when
/// it is known (older records lack it and read as changed at the restart). Values are JSON envelopes with a format version:
/// `{"v":1,"r":<record>}` for entities and documents, where every nested
/// entity is reduced to a reference stub (`{"id":…}`, identity member only)
/// — the normalized store: a record never holds another entity's contents;
/// `{"v":1,"ids":[…]}` for collections; `{"v":1,"required":{…}}` for the
/// schema. A value that does not decode, or has another `v`, is a miss:
/// no migrations, a format change starts fresh.
public struct RecordCodec: Sendable {
    public static let formatVersion = 1
    public let idKey: String

    /// Deepest record read back: stored values nest at most `--max-depth` − 1
    /// levels (the engine refuses deeper ones), plus the envelope.
    public let maxDepth: Int

    public init(idKey: String, maxDepth: Int = 128) {
        self.idKey = idKey
        self.maxDepth = maxDepth + 2
    }

    public enum Kind: Sendable, Hashable {
        case entity, document, collection, schema, token
    }

    public static func entityKey(_ id: String) -> String { "e:" + id }
    public static func documentKey(_ key: String) -> String { "d:" + key }
    public static func collectionKey(_ name: String) -> String { "c:" + name }
    public static let schemaKey = "s:schema"
    public static func tokenKey(_ token: String) -> String { "t:" + token }

    /// The kind and name a storage key addresses.
    public static func parse(key: String) -> (Kind, String)? {
        guard key.utf8.count >= 2 else { return nil }
        let name = String(key.dropFirst(2))
        switch key.prefix(2) {
        case "e:": return (.entity, name)
        case "d:": return (.document, name)
        case "c:": return (.collection, name)
        case "s:": return (.schema, name)
        case "t:": return (.token, name)
        default: return nil
        }
    }

    /// A materialized value with its nested entities reduced to stubs.
    /// `includingRoot`: documents stub their root entity too.
    public func normalize(_ value: JSON, includingRoot: Bool) -> JSON {
        if includingRoot, let s = stub(value) { return s }
        guard case .object(var o) = value else { return stubAll(value) }
        for i in o.members.indices { o.members[i].value = stubAll(o.members[i].value) }
        return .object(o)
    }

    private func stub(_ v: JSON) -> JSON? {
        guard case .object(let o) = v, o.identity(idKey: idKey) != nil, let idv = o[idKey] else { return nil }
        return .object(JSONObject([.init(key: idKey, value: idv)]))
    }

    private func stubAll(_ v: JSON) -> JSON {
        if let s = stub(v) { return s }
        switch v {
        case .object(var o):
            for i in o.members.indices { o.members[i].value = stubAll(o.members[i].value) }
            return .object(o)
        case .array(var a):
            for i in a.indices { a[i] = stubAll(a[i]) }
            return .array(a)
        default:
            return v
        }
    }

    /// `changedAt`: the seq of the record's last change (PROTOCOL §3.2,
    /// §4.1), stored as `"s"` when known (> 0); a record without it counts
    /// as changed when it is read back.
    public func encode(record: JSON, changedAt: Int = 0) -> [UInt8] {
        var w = JSONWriter(capacity: 128)
        w.raw("{\"v\":1,")
        if changedAt > 0 {
            w.raw("\"s\":")
            w.int(changedAt)
            w.raw(",")
        }
        w.raw("\"r\":")
        w.value(record)
        w.raw("}")
        return w.bytes
    }

    public func encode(token seq: Int) -> [UInt8] {
        var w = JSONWriter(capacity: 24)
        w.raw("{\"v\":1,\"seq\":")
        w.int(seq)
        w.raw("}")
        return w.bytes
    }

    public func decodeToken(_ bytes: [UInt8]) -> Int? {
        guard let n = envelope(bytes)?["seq"]?.numberValue?.intValue, n > 0 else { return nil }
        return n
    }

    public func encode(collection ids: [String], changedAt: Int = 0) -> [UInt8] {
        var w = JSONWriter(capacity: 16 + ids.count * 16)
        w.raw("{\"v\":1,")
        if changedAt > 0 {
            w.raw("\"s\":")
            w.int(changedAt)
            w.raw(",")
        }
        w.raw("\"ids\":[")
        for (i, id) in ids.enumerated() {
            if i > 0 { w.raw(",") }
            w.string(id)
        }
        w.raw("]}")
        return w.bytes
    }

    public func encode(schema: [(type: String, members: [String])]) -> [UInt8] {
        var w = JSONWriter(capacity: 64)
        w.raw("{\"v\":1,\"required\":")
        Self.writeSchema(&w, schema)
        w.raw("}")
        return w.bytes
    }

    /// `{"Type":["member",…],…}` — the schema as both the wire and the cache spell it.
    static func writeSchema(_ w: inout JSONWriter, _ schema: [(type: String, members: [String])]) {
        w.raw("{")
        for (i, e) in schema.enumerated() {
            if i > 0 { w.raw(",") }
            w.string(e.type)
            w.raw(":[")
            for (j, m) in e.members.enumerated() {
                if j > 0 { w.raw(",") }
                w.string(m)
            }
            w.raw("]")
        }
        w.raw("}")
    }

    private func envelope(_ bytes: [UInt8]) -> JSONObject? {
        guard let v = try? JSONParser(maxDepth: maxDepth).parse(bytes), case .object(let o) = v,
              o["v"]?.numberValue?.intValue == Self.formatVersion
        else { return nil }
        return o
    }

    public func decodeRecord(_ bytes: [UInt8]) -> JSON? {
        guard let r = envelope(bytes)?["r"] else { return nil }
        return r
    }

    /// A record and the seq of its last change (0: not stored).
    public func decodeRecordAndChange(_ bytes: [UInt8]) -> (JSON, Int)? {
        guard let o = envelope(bytes), let r = o["r"] else { return nil }
        return (r, o["s"]?.numberValue?.intValue ?? 0)
    }

    /// A collection's identities and the seq of its last change (0: not stored).
    public func decodeCollectionAndChange(_ bytes: [UInt8]) -> ([String], Int)? {
        guard let ids = decodeCollection(bytes) else { return nil }
        return (ids, envelope(bytes)?["s"]?.numberValue?.intValue ?? 0)
    }

    public func decodeCollection(_ bytes: [UInt8]) -> [String]? {
        guard let list = envelope(bytes)?["ids"]?.arrayValue else { return nil }
        var out: [String] = []
        out.reserveCapacity(list.count)
        for v in list {
            guard let s = v.stringValue, !s.isEmpty else { return nil }
            out.append(s)
        }
        return out
    }

    public func decodeSchema(_ bytes: [UInt8]) -> [(type: String, members: [String])]? {
        guard let o = envelope(bytes)?["required"]?.objectValue else { return nil }
        var out: [(type: String, members: [String])] = []
        for m in o.members {
            guard let list = m.value.arrayValue else { return nil }
            out.append((m.key, list.compactMap { $0.stringValue }))
        }
        return out
    }

    /// The identities a normalized record references (its stubs).
    public func references(_ record: JSON, includingRoot: Bool) -> [String] {
        let t = Tree(idKey: idKey)
        let refs = includingRoot ? t.topEntities(record) : t.nestedEntities(record)
        return Array(refs.keys)
    }
}

