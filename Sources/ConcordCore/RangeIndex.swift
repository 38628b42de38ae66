import ConcordJSON
import ConcordProtocol

/// One end of a range a view is filed under: a number (as a Double), a
/// string (bytes, optionally "followed by anything", which is how a `prefix`
/// ends), or the first/last place of a kind. Numbers come before strings.
///
/// The index only has to find a superset of the views a value can satisfy —
/// each candidate view still tests its own condition — so every bound is
/// taken as inclusive, and numbers are compared as Doubles: rounding to the
/// nearest Double never reverses an order (a ≤ b ⇒ round(a) ≤ round(b)).
enum RangeKey {
    case start(Kind)
    case number(Double)
    case string(String, beyond: Bool)
    case end(Kind)

    enum Kind: UInt8 { case number = 1, string = 2 }

    var kind: Kind {
        switch self {
        case .start(let k), .end(let k): return k
        case .number: return .number
        case .string: return .string
        }
    }

    /// The key of a scalar a range can hold (a number or a string); nil otherwise.
    init?(_ v: JSON) {
        switch v {
        case .number(let n): self = .number(n.doubleValue)
        case .string(let s): self = .string(s, beyond: false)
        default: return nil
        }
    }

    /// Where a key lies among the keys of its kind: first, inside, last.
    @inline(__always)
    private var place: UInt8 {
        switch self {
        case .start: return 0
        case .number, .string: return 1
        case .end: return 2
        }
    }

    /// -1, 0 or 1. Numbers (the common case) are compared without copying
    /// either key: a tuple of the two (a `switch (a, b)`) copied both, with
    /// their strings, on every call — and an interval tree compares a few
    /// times per level.
    @inline(__always)
    static func compare(_ a: RangeKey, _ b: RangeKey) -> Int {
        if case .number(let x) = a, case .number(let y) = b { return x < y ? -1 : (x > y ? 1 : 0) }
        let ka = a.kind.rawValue, kb = b.kind.rawValue
        if ka != kb { return ka < kb ? -1 : 1 }
        let pa = a.place, pb = b.place
        if pa != pb || pa != 1 { return pa == pb ? 0 : (pa < pb ? -1 : 1) }
        // Two strings (two numbers were taken above).
        guard case .string(let x, let xb) = a, case .string(let y, let yb) = b else { return 0 }
        return compareStrings(x, xb, y, yb)
    }

    /// By UTF-8 bytes (``QueryEval/compareStrings(_:_:)``); a string
    /// "followed by anything" is above every string it prefixes.
    private static func compareStrings(_ x: String, _ xBeyond: Bool, _ y: String, _ yBeyond: Bool) -> Int {
        let c = QueryEval.compareStrings(x, y)
        if c == 0 { return xBeyond == yBeyond ? 0 : (xBeyond ? 1 : -1) }
        if c < 0, xBeyond, y.utf8.starts(with: x.utf8) { return 1 }
        if c > 0, yBeyond, x.utf8.starts(with: y.utf8) { return -1 }
        return c
    }
}

/// A ``RangeKey`` as plain bits, so that an interval tree compares keys
/// without copying them (a key may hold a string, so copying one is a
/// reference count): which kind and place (`major`), and a number's value.
/// Two strings are the one case it cannot order (``compare(_:_:)`` says nil).
struct RangeOrd {
    let major: UInt8
    let number: Double

    init(_ k: RangeKey) {
        switch k {
        case .start(let kind): major = kind.rawValue &* 4
        case .number: major = 5
        case .string: major = 9
        case .end(let kind): major = kind.rawValue &* 4 &+ 2
        }
        if case .number(let d) = k { number = d } else { number = 0 }
    }

    /// -1, 0 or 1 as ``RangeKey/compare(_:_:)``; nil for two strings.
    @inline(__always)
    static func compare(_ a: RangeOrd, _ b: RangeOrd) -> Int? {
        if a.major != b.major { return a.major < b.major ? -1 : 1 }
        if a.major == 5 { return a.number < b.number ? -1 : (a.number > b.number ? 1 : 0) }
        return a.major == 9 ? nil : 0
    }
}

/// How a view is found by the range index: the values at `path` it can
/// hold lie in `lo ... hi` (bounds inclusive, see ``RangeKey``).
struct RangeBounds {
    var path: QueryPath
    var lo: RangeKey
    var hi: RangeKey

    /// A range on one scalar path that the condition cannot match without:
    /// `lt/lte/gt/gte` on a number or string, or `prefix`, at the top or
    /// directly under `all` (those of the first such path, intersected).
    static func of(_ c: CompiledCondition?) -> RangeBounds? {
        guard let c else { return nil }
        let parts: [CompiledCondition]
        if case .all(let list) = c { parts = list } else { parts = [c] }
        var result: RangeBounds?
        for part in parts {
            guard let (path, lo, hi) = bounds(part) else { continue }
            guard var r = result else {
                result = RangeBounds(path: path, lo: lo, hi: hi)
                continue
            }
            // Another bound of the same path and kind narrows it; the
            // condition itself still decides (a superset is enough).
            guard path == r.path, lo.kind == r.lo.kind else { continue }
            if RangeKey.compare(lo, r.lo) > 0 { r.lo = lo }
            if RangeKey.compare(hi, r.hi) < 0 { r.hi = hi }
            result = r
        }
        return result
    }

    private static func bounds(_ c: CompiledCondition) -> (QueryPath, RangeKey, RangeKey)? {
        switch c {
        case .compare(let p, let op, let v, _):
            guard let k = RangeKey(v) else { return nil }
            switch op {
            case .lt, .lte: return (p, .start(k.kind), k)
            case .gt, .gte: return (p, k, .end(k.kind))
            default: return nil
            }
        case .prefix(let p, let s):
            return (p, .string(s, beyond: false), .string(s, beyond: true))
        default:
            return nil
        }
    }
}

/// The views of one type filed by the range of one path: an interval tree
/// (a treap ordered by low bound, each node knowing the highest high bound
/// below it), in flat arrays with 32-bit links. Filing and unfiling are
/// O(log n); finding the views whose range holds a value is O(log n + k)
/// for k views found. Priorities hash the view's serial number, so the
/// shape is the same on every run.
struct RangeTree {
    private struct Node {
        var lo: RangeKey
        var hi: RangeKey
        var maxHi: RangeKey
        var loOrd: RangeOrd
        var hiOrd: RangeOrd
        var maxHiOrd: RangeOrd
        var serial: UInt32
        unowned(unsafe) var view: QueryView  // the view unfiles itself before it goes
        var left: Int32 = -1
        var right: Int32 = -1
        var priority: UInt32
    }
    private var nodes: [Node] = []
    private var free: [Int32] = []
    private var root: Int32 = -1
    private(set) var count = 0

    private static func priority(_ serial: UInt32) -> UInt32 {
        var h = serial &* 0x9E37_79B9
        h ^= h >> 16
        h = h &* 0x85EB_CA6B
        h ^= h >> 13
        return h
    }

    /// Compares two keys by their bits, and by their strings only when both are strings.
    @inline(__always)
    private static func compare(_ a: RangeOrd, _ ak: @autoclosure () -> RangeKey, _ b: RangeOrd, _ bk: @autoclosure () -> RangeKey) -> Int {
        RangeOrd.compare(a, b) ?? RangeKey.compare(ak(), bk())
    }

    /// (lo, serial) order.
    private func less(_ lo: RangeKey, _ loOrd: RangeOrd, _ serial: UInt32, than n: Int32) -> Bool {
        let c = Self.compare(loOrd, lo, nodes[Int(n)].loOrd, nodes[Int(n)].lo)
        return c != 0 ? c < 0 : serial < nodes[Int(n)].serial
    }

    /// A node's highest high bound: its own or its children's (filing and
    /// unfiling only, so the keys are simply copied here).
    private mutating func update(_ n: Int32) {
        var ord = nodes[Int(n)].hiOrd, key = nodes[Int(n)].hi
        for c in [nodes[Int(n)].left, nodes[Int(n)].right] where c >= 0 {
            if Self.compare(nodes[Int(c)].maxHiOrd, nodes[Int(c)].maxHi, ord, key) > 0 {
                ord = nodes[Int(c)].maxHiOrd
                key = nodes[Int(c)].maxHi
            }
        }
        nodes[Int(n)].maxHi = key
        nodes[Int(n)].maxHiOrd = ord
    }

    /// Splits `n` into (< (lo, serial), ≥ (lo, serial)).
    private mutating func split(_ n: Int32, _ lo: RangeKey, _ loOrd: RangeOrd, _ serial: UInt32) -> (Int32, Int32) {
        if n < 0 { return (-1, -1) }
        if less(lo, loOrd, serial, than: n) {
            let (a, b) = split(nodes[Int(n)].left, lo, loOrd, serial)
            nodes[Int(n)].left = b
            update(n)
            return (a, n)
        } else {
            let (a, b) = split(nodes[Int(n)].right, lo, loOrd, serial)
            nodes[Int(n)].right = a
            update(n)
            return (n, b)
        }
    }

    private mutating func merge(_ a: Int32, _ b: Int32) -> Int32 {
        if a < 0 { return b }
        if b < 0 { return a }
        if nodes[Int(a)].priority > nodes[Int(b)].priority {
            nodes[Int(a)].right = merge(nodes[Int(a)].right, b)
            update(a)
            return a
        } else {
            nodes[Int(b)].left = merge(a, nodes[Int(b)].left)
            update(b)
            return b
        }
    }

    /// Files `view` (serial `serial`, not filed yet) under `lo ... hi`.
    mutating func insert(_ view: QueryView, serial: UInt32, lo: RangeKey, hi: RangeKey) {
        let node = Node(lo: lo, hi: hi, maxHi: hi, loOrd: RangeOrd(lo), hiOrd: RangeOrd(hi), maxHiOrd: RangeOrd(hi),
                        serial: serial, view: view, priority: Self.priority(serial))
        let n: Int32
        if let f = free.popLast() {
            nodes[Int(f)] = node
            n = f
        } else {
            nodes.append(node)
            n = Int32(nodes.count - 1)
        }
        let (a, b) = split(root, lo, RangeOrd(lo), serial)
        root = merge(merge(a, n), b)
        count += 1
    }

    /// Unfiles the view filed with (`lo`, `serial`); nothing when none is.
    mutating func remove(lo: RangeKey, serial: UInt32) {
        root = remove(root, lo, RangeOrd(lo), serial)
    }

    private mutating func remove(_ n: Int32, _ lo: RangeKey, _ loOrd: RangeOrd, _ serial: UInt32) -> Int32 {
        if n < 0 { return -1 }
        if nodes[Int(n)].serial == serial {
            let m = merge(nodes[Int(n)].left, nodes[Int(n)].right)
            free.append(n)
            count -= 1
            return m
        }
        if less(lo, loOrd, serial, than: n) {
            nodes[Int(n)].left = remove(nodes[Int(n)].left, lo, loOrd, serial)
        } else {
            nodes[Int(n)].right = remove(nodes[Int(n)].right, lo, loOrd, serial)
        }
        update(n)
        return n
    }

    /// Calls `body` with every view whose range holds `x`.
    func forEach(holding x: RangeKey, _ body: (QueryView) -> Void) {
        let xo = RangeOrd(x)
        nodes.withUnsafeBufferPointer { Self.visit($0, root, x, xo, body) }
    }

    /// Reads the nodes in place and compares their keys' bits (strings
    /// only between strings): copying a node copied its three keys, and
    /// comparing two keys copied both.
    private static func visit(_ nodes: UnsafeBufferPointer<Node>, _ n: Int32, _ x: RangeKey, _ xo: RangeOrd, _ body: (QueryView) -> Void) {
        var n = n
        while n >= 0 {
            let p = nodes.baseAddress! + Int(n)
            // Nothing below reaches up to x.
            if (RangeOrd.compare(p.pointee.maxHiOrd, xo) ?? RangeKey.compare(p.pointee.maxHi, x)) < 0 { return }
            if p.pointee.left >= 0 { visit(nodes, p.pointee.left, x, xo, body) }
            // Everything to the right starts above x when this one does.
            if (RangeOrd.compare(p.pointee.loOrd, xo) ?? RangeKey.compare(p.pointee.lo, x)) > 0 { return }
            if (RangeOrd.compare(p.pointee.hiOrd, xo) ?? RangeKey.compare(p.pointee.hi, x)) >= 0 { body(p.pointee.view) }
            n = p.pointee.right
        }
    }

    /// Every filed view, in (lo, serial) order (for the internal checks).
    func all() -> [(view: QueryView, serial: UInt32)] {
        var out: [(QueryView, UInt32)] = []
        func walk(_ n: Int32) {
            guard n >= 0 else { return }
            walk(nodes[Int(n)].left)
            out.append((nodes[Int(n)].view, nodes[Int(n)].serial))
            walk(nodes[Int(n)].right)
        }
        walk(root)
        return out
    }
}

/// A type's entities in memory ordered by the value of one path (its
/// ``RangeKey``), kept while a range view on that path lives: a new range
/// view is built from the entities its range can hold, in O(log n + k),
/// instead of testing every entity of the type (100,000 posts: a scan of
/// ~60 ms on the sequencer per definition). Entities whose value at the path
/// is not a number or a string are not in it — no range can hold them, as
/// for ``RangeTree``. A class: the engine updates it in place through its table.
final class RangeEntityIndex {
    let path: QueryPath
    /// Entities by handle; ties broken by identity (text).
    private var tree: OrderTree<RangeKey>

    init(path: QueryPath, identities: Identities) {
        self.path = path
        tree = OrderTree<RangeKey>(vacant: .start(.number)) { [unowned identities] a, b in
            let c = RangeKey.compare(a.values, b.values)
            return c != 0 ? c < 0 : QueryEval.compareStrings(identities.name(a.id), identities.name(b.id)) < 0
        }
    }

    var count: Int { tree.count }

    /// The key `value` is filed under, nil when none.
    func key(_ value: JSON?) -> RangeKey? {
        guard let value, let x = QueryEval.value(value, path) else { return nil }
        return RangeKey(x)
    }

    func insert(_ id: UInt32, _ k: RangeKey) { tree.insert(.init(values: k, id: id)) }
    func remove(_ id: UInt32, _ k: RangeKey) { tree.remove(.init(values: k, id: id)) }

    /// Moves `id` from the key of `old` to the key of `new`; returns the change in entries.
    func move(_ id: UInt32, from old: JSON?, to new: JSON?) -> Int {
        let x = old.flatMap { QueryEval.value($0, path) }, y = new.flatMap { QueryEval.value($0, path) }
        // The same value at the path (an author renamed under a post): no move.
        if let x, let y, x == y { return 0 }
        let a = x.flatMap(RangeKey.init), b = y.flatMap(RangeKey.init)
        switch (a, b) {
        case (nil, nil): return 0
        case (let a?, nil): remove(id, a); return -1
        case (nil, let b?): insert(id, b); return 1
        case (let a?, let b?):
            if RangeKey.compare(a, b) == 0 { return 0 }
            remove(id, a)
            insert(id, b)
            return 0
        }
    }

    /// The handles whose key lies in `lo ... hi`, in key order.
    func ids(from lo: RangeKey, through hi: RangeKey) -> [UInt32] {
        let first = tree.prefixCount { RangeKey.compare($0.values, lo) < 0 }
        let end = tree.prefixCount { RangeKey.compare($0.values, hi) <= 0 }
        return tree.ids(first..<end)
    }

    /// Every (key, identity), in order (for the internal checks).
    func all() -> [(key: RangeKey, id: UInt32)] {
        (0..<tree.count).map { let e = tree.select($0); return (e.values, e.id) }
    }
}
