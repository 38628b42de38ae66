public import ConcordJSON

/// A live query (PROTOCOL.md §3.1): the entities of one type whose current
/// value satisfies `condition`, sorted by `order` then by identity, with the
/// window `offset ..< offset + limit`.
public struct QuerySpec: Sendable {
    /// The entity type queried (the part of the identity before `:`).
    public var type: String
    /// The predicate; nil: every entity of the type.
    public var condition: QueryCondition?
    /// Sort keys, first key first; identity breaks the last tie.
    public var order: [QueryOrderKey]
    /// Matches skipped before the window.
    public var offset: Int
    /// nil: no limit.
    public var limit: Int?

    /// A definition; ``decode(_:)`` makes one from the wire and checks its bounds.
    public init(type: String, condition: QueryCondition? = nil, order: [QueryOrderKey] = [], offset: Int = 0, limit: Int? = nil) {
        self.type = type
        self.condition = condition
        self.order = order
        self.offset = offset
        self.limit = limit
    }

    /// One text per definition: queries with equal definitions share one
    /// view in the server. Paths are written as arrays, numbers canonically.
    public var canonicalKey: String { wireJSON.compactString }

    /// ``canonicalKey`` of this definition and of the same without its
    /// window (offset 0, no limit), from one encoding of the rest: a query
    /// of a 100,000-value `in` list is written once, not once per key.
    public var canonicalKeys: (windowed: String, unwindowed: String) {
        var o = wireJSON
        if case .object(var m) = o {
            m["offset"] = nil
            m["limit"] = nil
            o = .object(m)
        }
        // The encoding without the window, its closing brace taken off;
        // each key made from its bytes at once, so it holds no spare
        // capacity (a view keeps two keys as long as it lives).
        var head = o.encoded()
        head.removeLast()
        var tail = ",\"offset\":\(offset)"
        if let limit { tail += ",\"limit\":\(limit)" }
        let windowed = String(decoding: head + Array(tail.utf8) + [UInt8(ascii: "}")], as: UTF8.self)
        let unwindowed = String(decoding: head + Array(",\"offset\":0}".utf8), as: UTF8.self)
        return (windowed, unwindowed)
    }

    /// The `query` object of the wire protocol, in its canonical form (what
    /// ``decode(_:)`` reads back as an equal definition; the SDK sends it).
    public var wireJSON: JSON {
        var o = JSONObject()
        o["type"] = .string(type)
        if let condition { o["where"] = condition.canonicalJSON }
        o["order"] = .array(order.map { k in
            var ko = JSONObject()
            ko["path"] = .array(k.path.map { .string($0) })
            if k.descending { ko["desc"] = .bool(true) }
            return .object(ko)
        })
        o["offset"] = .int(offset)
        if let limit { o["limit"] = .int(limit) }
        return .object(o)
    }
}

/// A member path: names, read through nested objects (and so through nested entities).
public typealias QueryPath = [String]

/// A predicate over an entity's current value (PROTOCOL.md §3.1).
public indirect enum QueryCondition: Sendable {
    /// The comparisons of one path with one value, by their wire names.
    public enum Comparison: String, Sendable, CaseIterable {
        /// Equal, not equal, and the orderings (numbers with numbers, strings with strings).
        case eq, ne, lt, lte, gt, gte
    }

    /// The value at the path compared with a JSON value.
    case compare(QueryPath, Comparison, JSON)
    /// Equals one of the values (`in`).
    case oneOf(QueryPath, [JSON])
    /// The path is present (true) or absent (false).
    case exists(QueryPath, Bool)
    /// The array at the path holds an equal element.
    case contains(QueryPath, JSON)
    /// The string at the path starts with the prefix.
    case prefix(QueryPath, String)
    /// Every condition holds.
    case all([QueryCondition])
    /// At least one condition holds.
    case any([QueryCondition])
    /// The condition does not hold.
    case not(QueryCondition)

    var canonicalJSON: JSON {
        func leaf(_ path: QueryPath, _ op: String, _ v: JSON) -> JSON {
            var o = JSONObject()
            o["path"] = .array(path.map { .string($0) })
            o[op] = v.canonicalForKey
            return .object(o)
        }
        switch self {
        case .compare(let p, let op, let v): return leaf(p, op.rawValue, v)
        case .oneOf(let p, let list): return leaf(p, "in", .array(list))
        case .exists(let p, let b): return leaf(p, "exists", .bool(b))
        case .contains(let p, let v): return leaf(p, "contains", v)
        case .prefix(let p, let s): return leaf(p, "prefix", .string(s))
        case .all(let list): return ["all": .array(list.map(\.canonicalJSON))]
        case .any(let list): return ["any": .array(list.map(\.canonicalJSON))]
        case .not(let c): return ["not": c.canonicalJSON]
        }
    }
}

/// One sort key of a query.
public struct QueryOrderKey: Sendable {
    /// The member sorted by.
    public var path: QueryPath
    /// Largest first.
    public var descending: Bool

    /// A sort key on `path`.
    public init(path: QueryPath, descending: Bool = false) {
        self.path = path
        self.descending = descending
    }
}

extension JSON {
    /// The same value with integers in their canonical spelling (`-0` → `0`),
    /// so equal definitions give equal keys.
    var canonicalForKey: JSON {
        switch self {
        case .number(let n):
            if let t = n.integerText { return .number(JSONNumber(unchecked: t)) }
            return self
        case .array(let a): return .array(a.map(\.canonicalForKey))
        case .object(let o): return .object(JSONObject(o.members.map { .init(key: $0.key, value: $0.value.canonicalForKey) }))
        default: return self
        }
    }
}

// MARK: Decoding

extension QuerySpec {
    static let operators = ["eq", "ne", "lt", "lte", "gt", "gte", "in", "exists", "contains", "prefix"]

    /// The most sort keys a query may have (`bad_request` past it). Every
    /// matching entity keeps one sort value per key, so keys multiply a
    /// view's memory; like a database's practical sort, a handful suffice.
    public static let maxOrderKeys = 8
    /// The most condition objects a query may have, combinators included
    /// (`bad_request` past it). Each costs a few microseconds to decode and
    /// prepare; the bound keeps one request's cost small.
    public static let maxConditions = 10_000
    /// The most values all `in` lists of a query may hold together
    /// (`bad_request` past it). They become one hash set per list.
    public static let maxInValues = 100_000

    /// Decodes the `query` member of `subscribe` or `get`. Errors are
    /// `bad_request` with a message naming the place (`query.where.all[1]: …`).
    public static func decode(_ value: JSON, at place: String = "query") throws(ProtocolError) -> QuerySpec {
        guard case .object(let o) = value else { throw ProtocolError(.badRequest, "\(place) must be an object") }
        guard let t = o["type"], !t.isNull else { throw ProtocolError(.badRequest, "\(place).type is missing (the type of the entities to list)") }
        guard case .string(let type) = t, !type.isEmpty else {
            throw ProtocolError(.badRequest, "\(place).type must be a non-empty string")
        }
        var spec = QuerySpec(type: type)
        var terms = Terms()
        if let w = o["where"], !w.isNull { spec.condition = try decodeCondition(w, at: .member(.root(place), "where"), terms: &terms) }
        if let ord = o["order"], !ord.isNull {
            guard case .array(let list) = ord else { throw ProtocolError(.badRequest, "\(place).order must be an array of {\"path\":…,\"desc\":…}") }
            guard list.count <= maxOrderKeys else {
                throw ProtocolError(.badRequest, "\(place).order has \(list.count) keys; a query may sort by at most \(maxOrderKeys)")
            }
            for (i, k) in list.enumerated() {
                let at = "\(place).order[\(i)]"
                guard case .object(let ko) = k else { throw ProtocolError(.badRequest, "\(at) must be an object {\"path\":…,\"desc\":…}") }
                for m in ko.members where m.key != "path" && m.key != "desc" {
                    throw ProtocolError(.badRequest, "\(at): unknown member '\(clip(m.key))' (an order key has 'path' and 'desc')")
                }
                guard let p = ko["path"] else { throw ProtocolError(.badRequest, "\(at).path is missing") }
                var key = QueryOrderKey(path: try decodePath(p, at: .member(.root(at), "path")))
                if let d = ko["desc"], !d.isNull {
                    guard case .bool(let b) = d else { throw ProtocolError(.badRequest, "\(at).desc must be true or false") }
                    key.descending = b
                }
                spec.order.append(key)
            }
        }
        if let off = o["offset"], !off.isNull {
            guard let n = off.numberValue?.intValue, n >= 0 else {
                throw ProtocolError(.badRequest, "\(place).offset must be an integer ≥ 0")
            }
            spec.offset = n
        }
        if let lim = o["limit"], !lim.isNull {
            guard let n = lim.numberValue?.intValue, n >= 1 else {
                throw ProtocolError(.badRequest, "\(place).limit must be an integer ≥ 1")
            }
            spec.limit = n
        }
        return spec
    }

    static func decodePath(_ v: JSON, at place: QueryPlace) throws(ProtocolError) -> QueryPath {
        switch v {
        case .string(let s):
            let parts = s.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
            if s.isEmpty || parts.contains(where: \.isEmpty) {
                throw ProtocolError(.badRequest, "\(place): '\(clip(s))' is not a path (member names joined by '.', none empty)")
            }
            return parts
        case .array(let list):
            guard !list.isEmpty else { throw ProtocolError(.badRequest, "\(place): an array path needs at least one member name") }
            var out: [String] = []
            for (i, e) in list.enumerated() {
                guard case .string(let s) = e, !s.isEmpty else {
                    throw ProtocolError(.badRequest, "\(place)[\(i)] must be a non-empty member name")
                }
                out.append(s)
            }
            return out
        default:
            throw ProtocolError(.badRequest, "\(place) must be a string (\"a.b\") or an array of member names")
        }
    }

    /// What a condition has used of its bounds so far.
    struct Terms {
        var conditions = 0
        var inValues = 0
    }

    /// Counts `n` more condition objects; past ``maxConditions`` the query is refused.
    static func countConditions(_ n: Int, _ terms: inout Terms, at place: QueryPlace) throws(ProtocolError) {
        terms.conditions += n
        guard terms.conditions <= maxConditions else {
            throw ProtocolError(.badRequest, "\(place): the condition has more than \(maxConditions) conditions; a query may have at most \(maxConditions) (use 'in' for a list of values)")
        }
    }

    static func decodeCondition(_ v: JSON, at place: QueryPlace, terms: inout Terms) throws(ProtocolError) -> QueryCondition {
        guard case .object(let o) = v else { throw ProtocolError(.badRequest, "\(place) must be a condition object") }
        try countConditions(1, &terms, at: place)
        for combinator in ["all", "any"] {
            guard let c = o[combinator] else { continue }
            guard o.count == 1 else {
                throw ProtocolError(.badRequest, "\(place): '\(combinator)' takes no other members")
            }
            guard case .array(let list) = c else { throw ProtocolError(.badRequest, "\(place).\(combinator) must be an array of conditions") }
            var out: [QueryCondition] = []
            // Refused before any part of it is decoded when the list alone is too long.
            try countConditions(0, &terms, at: place)
            guard terms.conditions + list.count <= maxConditions else {
                throw ProtocolError(.badRequest, "\(place).\(combinator) has \(list.count) conditions; a query may have at most \(maxConditions) (use 'in' for a list of values)")
            }
            out.reserveCapacity(list.count)
            for (i, e) in list.enumerated() { out.append(try decodeCondition(e, at: .index(.member(place, combinator), i), terms: &terms)) }
            return combinator == "all" ? .all(out) : .any(out)
        }
        if let c = o["not"] {
            guard o.count == 1 else { throw ProtocolError(.badRequest, "\(place): 'not' takes no other members") }
            return .not(try decodeCondition(c, at: .member(place, "not"), terms: &terms))
        }
        var op: String?
        for m in o.members where m.key != "path" {
            guard operators.contains(m.key) else {
                throw ProtocolError(.badRequest, "\(place): unknown operator '\(clip(m.key))' (one of \(operators.joined(separator: ", ")), all, any, not)")
            }
            if let first = op, first != m.key {
                throw ProtocolError(.badRequest, "\(place): two operators ('\(first)' and '\(m.key)'); use {\"all\":[…]} to combine")
            }
            op = m.key
        }
        guard let p = o["path"] else {
            throw ProtocolError(.badRequest, "\(place): a condition needs 'path' and one operator, or one of all, any, not")
        }
        let path = try decodePath(p, at: .member(place, "path"))
        guard let op, let arg = o[op] else { throw ProtocolError(.badRequest, "\(place): no operator (one of \(operators.joined(separator: ", ")))") }
        switch op {
        case "in":
            guard case .array(let list) = arg else { throw ProtocolError(.badRequest, "\(place).in must be an array of values") }
            terms.inValues += list.count
            guard terms.inValues <= maxInValues else {
                throw ProtocolError(.badRequest, "\(place).in: the query's 'in' lists hold more than \(maxInValues) values; a query may have at most \(maxInValues)")
            }
            return .oneOf(path, list)
        case "exists":
            guard case .bool(let b) = arg else { throw ProtocolError(.badRequest, "\(place).exists must be true or false") }
            return .exists(path, b)
        case "contains":
            return .contains(path, arg)
        case "prefix":
            guard case .string(let s) = arg else { throw ProtocolError(.badRequest, "\(place).prefix must be a string") }
            return .prefix(path, s)
        default:
            return .compare(path, QueryCondition.Comparison(rawValue: op)!, arg)
        }
    }
}

/// Where in a query a part is (`query.where.all[1].path`), spelled out only
/// when an error names it: decoding a condition of 100,000 parts builds no
/// text for the parts that are fine.
indirect enum QueryPlace: CustomStringConvertible {
    case root(String)
    case member(QueryPlace, String)
    case index(QueryPlace, Int)

    var description: String {
        switch self {
        case .root(let s): s
        case .member(let p, let name): "\(p).\(name)"
        case .index(let p, let i): "\(p)[\(i)]"
        }
    }
}
