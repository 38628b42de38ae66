import ConcordJSON
import ConcordProtocol

/// A query's condition prepared once per view, so that testing an entity
/// costs O(conditions) whatever the size of the request: an `in` list
/// becomes a hash set of index keys (``QueryEval/indexKey(_:)``), and the
/// `eq` and `in` conditions of one path under `any` merge into one such set
/// (the order of `any` does not matter). Arrays and objects, which have no
/// index key, are compared one by one (`others`).
indirect enum CompiledCondition: Sendable {
    /// The last value: the argument as an integer when it is one of at
    /// most 15 digits, so that an ordering of two such integers (a date, a
    /// count) is one integer comparison instead of reading two lexemes.
    case compare(QueryPath, QueryCondition.Comparison, JSON, Int?)
    case oneOf(QueryPath, keys: Set<String>, others: [JSON])
    case exists(QueryPath, Bool)
    case contains(QueryPath, JSON)
    case prefix(QueryPath, String)
    case all([CompiledCondition])
    case any([CompiledCondition])
    case not(CompiledCondition)

    init(_ c: QueryCondition) {
        switch c {
        case .compare(let p, let op, let v):
            if case .number(let n) = v { self = .compare(p, op, v, n.smallIntegerValue) } else { self = .compare(p, op, v, nil) }
        case .oneOf(let p, let list): self = Self.set(p, list)
        case .exists(let p, let b): self = .exists(p, b)
        case .contains(let p, let v): self = .contains(p, v)
        case .prefix(let p, let s): self = .prefix(p, s)
        case .all(let list): self = .all(list.map(CompiledCondition.init))
        case .not(let inner): self = .not(CompiledCondition(inner))
        case .any(let list):
            // eq/in per path, in order of first appearance (deterministic).
            var paths: [QueryPath] = []
            var values: [QueryPath: [JSON]] = [:]
            var rest: [CompiledCondition] = []
            for sub in list {
                switch sub {
                case .compare(let p, .eq, let v):
                    if values[p] == nil { paths.append(p) }
                    values[p, default: []].append(v)
                case .oneOf(let p, let l):
                    if values[p] == nil { paths.append(p) }
                    values[p, default: []].append(contentsOf: l)
                default:
                    rest.append(CompiledCondition(sub))
                }
            }
            let merged = paths.map { Self.set($0, values[$0]!) } + rest
            self = merged.count == 1 ? merged[0] : .any(merged)
        }
    }

    private static func set(_ p: QueryPath, _ list: [JSON]) -> CompiledCondition {
        var keys = Set<String>(minimumCapacity: list.count)
        var others: [JSON] = []
        for v in list {
            if let k = QueryEval.indexKey(v) { keys.insert(k) } else { others.append(v) }
        }
        return .oneOf(p, keys: keys, others: others)
    }

    /// Whether `v` satisfies the condition (the meaning of ``QueryEval/matches(_:_:)``).
    func matches(_ v: JSON) -> Bool {
        switch self {
        case .compare(let path, let op, let arg, let bound):
            let x = QueryEval.value(v, path)
            if let bound, op != .eq, op != .ne, case .number(let n)? = x, let i = n.smallIntegerValue {
                switch op {
                case .lt: return i < bound
                case .lte: return i <= bound
                case .gt: return i > bound
                default: return i >= bound
                }
            }
            return QueryEval.test(x, op, arg)
        case .oneOf(let path, let keys, let others):
            guard let x = QueryEval.value(v, path) else { return false }
            if let k = QueryEval.indexKey(x) { return keys.contains(k) }
            return others.contains { $0 == x }
        case .exists(let path, let want):
            return (QueryEval.value(v, path) != nil) == want
        case .contains(let path, let arg):
            guard case .array(let list)? = QueryEval.value(v, path) else { return false }
            return list.contains { $0 == arg }
        case .prefix(let path, let p):
            guard case .string(let s)? = QueryEval.value(v, path) else { return false }
            return s.utf8.starts(with: p.utf8)
        case .all(let list):
            return list.allSatisfy { $0.matches(v) }
        case .any(let list):
            return list.contains { $0.matches(v) }
        case .not(let inner):
            return !inner.matches(v)
        }
    }
}
