public import ConcordJSON

/// A live query (PROTOCOL.md §3.1), built in Swift:
///
/// ```swift
/// let q = ConcordQuery(Post.self, where: .all([.eq("author.id", "Person:7"), .exists("draft", false)]),
///                      order: [.descending("date")], limit: 20)
/// let feed = try await QueryDataProvider<Post>.open(client: client, query: q)
/// ```
///
/// Paths are member names joined by `.`; `ConcordQuery.Path(["a.b", "c"])`
/// names members that hold a `.`. Values are JSON literals.
public struct ConcordQuery: Sendable, Equatable {
    public struct Path: Sendable, Equatable, ExpressibleByStringLiteral {
        public var components: [String]
        public init(_ components: [String]) { self.components = components }
        public init(stringLiteral value: String) { components = value.split(separator: ".", omittingEmptySubsequences: false).map(String.init) }
        var json: JSON {
            components.contains { $0.contains(".") } ? .array(components.map { .string($0) }) : .string(components.joined(separator: "."))
        }
    }

    public indirect enum Condition: Sendable, Equatable {
        case eq(Path, JSON)
        case ne(Path, JSON)
        case lt(Path, JSON)
        case lte(Path, JSON)
        case gt(Path, JSON)
        case gte(Path, JSON)
        case oneOf(Path, [JSON])
        case exists(Path, Bool)
        case contains(Path, JSON)
        case prefix(Path, String)
        case all([Condition])
        case any([Condition])
        case not(Condition)

        var json: JSON {
            func leaf(_ p: Path, _ op: String, _ v: JSON) -> JSON { ["path": p.json, op: v] }
            switch self {
            case .eq(let p, let v): return leaf(p, "eq", v)
            case .ne(let p, let v): return leaf(p, "ne", v)
            case .lt(let p, let v): return leaf(p, "lt", v)
            case .lte(let p, let v): return leaf(p, "lte", v)
            case .gt(let p, let v): return leaf(p, "gt", v)
            case .gte(let p, let v): return leaf(p, "gte", v)
            case .oneOf(let p, let list): return leaf(p, "in", .array(list))
            case .exists(let p, let b): return leaf(p, "exists", .bool(b))
            case .contains(let p, let v): return leaf(p, "contains", v)
            case .prefix(let p, let s): return leaf(p, "prefix", .string(s))
            case .all(let list): return ["all": .array(list.map(\.json))]
            case .any(let list): return ["any": .array(list.map(\.json))]
            case .not(let c): return ["not": c.json]
            }
        }
    }

    public struct Order: Sendable, Equatable {
        public var path: Path
        public var descending: Bool
        public init(_ path: Path, descending: Bool = false) {
            self.path = path
            self.descending = descending
        }
        public static func ascending(_ path: Path) -> Order { Order(path) }
        public static func descending(_ path: Path) -> Order { Order(path, descending: true) }
    }

    public var type: String
    public var condition: Condition?
    public var order: [Order]
    public var offset: Int
    public var limit: Int?
    /// A query given as its wire JSON (tools that take it from a user); sent as is.
    private var raw: JSON?

    /// A query in its wire form, sent unchanged (the server validates it).
    public init(raw: JSON, type: String) {
        self.init(type: type)
        self.raw = raw
    }

    public init(type: String, where condition: Condition? = nil, order: [Order] = [], offset: Int = 0, limit: Int? = nil) {
        self.type = type
        self.condition = condition
        self.order = order
        self.offset = offset
        self.limit = limit
    }

    /// A query over a model type (its ``ConcordModel/typeName``).
    public init<M: ConcordModel>(_ model: M.Type, where condition: Condition? = nil, order: [Order] = [], offset: Int = 0,
                                 limit: Int? = nil) {
        self.init(type: M.typeName, where: condition, order: order, offset: offset, limit: limit)
    }

    /// The `query` object of the wire protocol.
    public var json: JSON {
        if let raw { return raw }
        var o = JSONObject()
        o["type"] = .string(type)
        if let condition { o["where"] = condition.json }
        if !order.isEmpty {
            o["order"] = .array(order.map { k in
                var ko = JSONObject()
                ko["path"] = k.path.json
                if k.descending { ko["desc"] = true }
                return .object(ko)
            })
        }
        if offset != 0 { o["offset"] = .int(offset) }
        if let limit { o["limit"] = .int(limit) }
        return .object(o)
    }
}
