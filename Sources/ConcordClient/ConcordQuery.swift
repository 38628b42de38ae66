public import ConcordJSON
public import ConcordProtocol

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

        /// The protocol's condition (ConcordProtocol spells the wire form).
        var spec: QueryCondition {
            switch self {
            case .eq(let p, let v): .compare(p.components, .eq, v)
            case .ne(let p, let v): .compare(p.components, .ne, v)
            case .lt(let p, let v): .compare(p.components, .lt, v)
            case .lte(let p, let v): .compare(p.components, .lte, v)
            case .gt(let p, let v): .compare(p.components, .gt, v)
            case .gte(let p, let v): .compare(p.components, .gte, v)
            case .oneOf(let p, let list): .oneOf(p.components, list)
            case .exists(let p, let b): .exists(p.components, b)
            case .contains(let p, let v): .contains(p.components, v)
            case .prefix(let p, let s): .prefix(p.components, s)
            case .all(let list): .all(list.map(\.spec))
            case .any(let list): .any(list.map(\.spec))
            case .not(let c): .not(c.spec)
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

    /// The protocol's definition of this query.
    public var spec: QuerySpec {
        QuerySpec(type: type, condition: condition?.spec, order: order.map { QueryOrderKey(path: $0.path.components, descending: $0.descending) },
                  offset: offset, limit: limit)
    }

    /// The `query` object of the wire protocol (ConcordProtocol's canonical
    /// form), or the raw object this query was made from.
    public var json: JSON { raw ?? spec.wireJSON }

}
