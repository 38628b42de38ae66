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
    /// A member path: names read through nested objects (and nested entities).
    public struct Path: Sendable, Equatable, ExpressibleByStringLiteral {
        /// The member names, outermost first.
        public var components: [String]
        /// A path from its names (names may hold a `.`).
        public init(_ components: [String]) { self.components = components }
        /// A path written with dots: `"author.name"`.
        public init(stringLiteral value: String) { components = value.split(separator: ".", omittingEmptySubsequences: false).map(String.init) }
    }

    /// A predicate over an entity's current value (PROTOCOL.md §3.1): comparisons on a path, combined with `all`, `any` and `not`.
    public indirect enum Condition: Sendable, Equatable {
        /// The value at the path equals the JSON value (numbers by value, objects by members).
        case eq(Path, JSON)
        /// The value at the path is present and not equal.
        case ne(Path, JSON)
        /// Less than: numbers with numbers, strings with strings (by UTF-8 bytes).
        case lt(Path, JSON)
        /// Less than or equal.
        case lte(Path, JSON)
        /// Greater than.
        case gt(Path, JSON)
        /// Greater than or equal.
        case gte(Path, JSON)
        /// Equals one of the values (`in` on the wire).
        case oneOf(Path, [JSON])
        /// The path is present (true) or absent (false); `null` counts as present.
        case exists(Path, Bool)
        /// The array at the path holds an element equal to the value.
        case contains(Path, JSON)
        /// The string at the path starts with the prefix.
        case prefix(Path, String)
        /// Every condition holds (`[]`: true).
        case all([Condition])
        /// At least one condition holds (`[]`: false).
        case any([Condition])
        /// The condition does not hold.
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

    /// One sort key; ties are broken by the next key, then by identity.
    public struct Order: Sendable, Equatable {
        /// The member sorted by.
        public var path: Path
        /// Largest first.
        public var descending: Bool
        /// A sort key on `path`.
        public init(_ path: Path, descending: Bool = false) {
            self.path = path
            self.descending = descending
        }
        /// Smallest first.
        public static func ascending(_ path: Path) -> Order { Order(path) }
        /// Largest first.
        public static func descending(_ path: Path) -> Order { Order(path, descending: true) }
    }

    /// The entity type queried (the part of the identity before `:`).
    public var type: String
    /// The predicate; nil: every entity of the type.
    public var condition: Condition?
    /// Sort keys, first key first; identity breaks the last tie.
    public var order: [Order]
    /// Matches skipped before the window.
    public var offset: Int
    /// The window's size; nil: every match.
    public var limit: Int?
    /// A query given as its wire JSON (tools that take it from a user); sent as is.
    private var raw: JSON?

    /// A query in its wire form, sent unchanged (the server validates it).
    public init(raw: JSON, type: String) {
        self.init(type: type)
        self.raw = raw
    }

    /// A query over the entities of `type` (its name on the wire).
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
