import ConcordJSON
import ConcordProtocol

/// A query definition made ready for the engine once: its two canonical
/// keys (with and without its window, from one encoding) and its condition
/// compiled (hash sets for `in` lists). Immutable, so it is made wherever the
/// request is decoded: a long line's on the parse thread with its parse, so
/// a 100,000-value `in` list never costs a turn its encoding and hashing.
public final class PreparedQuery: Sendable {
    let spec: QuerySpec
    let key: String
    let unwindowedKey: String
    let condition: CompiledCondition?
    /// Values in its `in` lists and `eq`/`in` conditions in all: what a view
    /// of it holds in its definition and sets, so what freeing it costs.
    let values: Int

    /// Past this many values, a dropped view's definition and sets are freed
    /// off the sequencer (``Engine/garbage``).
    static let large = 4096

    init(_ spec: QuerySpec) {
        self.spec = spec
        (key, unwindowedKey) = spec.canonicalKeys
        condition = spec.condition.map(CompiledCondition.init)
        values = spec.condition.map(Self.values) ?? 0
    }

    var isLarge: Bool { values >= Self.large }

    private static func values(_ c: QueryCondition) -> Int {
        switch c {
        case .compare, .exists, .contains, .prefix: return 1
        case .oneOf(_, let list): return list.count
        case .all(let list), .any(let list): return list.reduce(0) { $0 + values($1) }
        case .not(let inner): return values(inner)
        }
    }

    /// The query a request reads or subscribes to, if any.
    static func of(_ request: Request) -> QuerySpec? {
        switch request.op {
        case .get(.query(let spec)), .subscribe(_, .query(let spec)): return spec
        default: return nil
        }
    }
}

/// A request decoded off the sequencer (a long line, on the parse thread),
/// with its query prepared: the engine does not decode it again.
public final class PreparedRequest: Sendable {
    /// The line, as parsed, and where its `model` lies in it (``VerbatimModel``).
    let value: JSON
    let model: VerbatimModel?
    let request: Request
    let query: PreparedQuery?

    init(_ request: Request, value: JSON, model: VerbatimModel?) {
        self.value = value
        self.model = model
        self.request = request
        query = PreparedQuery.of(request).map(PreparedQuery.init)
    }
}
