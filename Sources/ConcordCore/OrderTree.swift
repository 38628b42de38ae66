import ConcordJSON

/// An order-statistic tree: a treap whose nodes know their subtree sizes and
/// parents, in flat arrays (32-bit links, no object per node). Insert,
/// remove, rank and select are O(log n) expected; priorities come from a
/// fixed hash of the identity, so the shape (and every result) is the same
/// on every run. Given a node handle, rank and remove compare nothing: they
/// climb the parent links (a view's members keep their handles).
///
/// Elements are (sort values, identity); `less` orders them and must be a
/// strict total order (the identity breaks ties, so no two elements are equal).
/// The identity is a 32-bit number: an entity's handle (``Identities``), or
/// a window's serial.
/// A view's members are ordered by their ``SortKey``; the range index of a
/// type's entities by the ``RangeKey`` of one path.
struct OrderTree<Values> {
    struct Element {
        var values: Values
        var id: UInt32
    }

    // A node's element, in two columns: `Values` is often of a size that
    // leaves padding, and the identity beside it in one struct rounded a
    // view's node from 28 to 32 bytes.
    private var values: [Values] = []
    private var ids: [UInt32] = []
    private var left: [Int32] = []
    private var right: [Int32] = []
    private var size: [Int32] = []
    private var parent: [Int32] = []
    private var free: [Int32] = []
    private var root: Int32 = -1
    let less: (Element, Element) -> Bool
    /// What a freed node holds (its values are released at once).
    private let vacant: Values

    init(vacant: Values, less: @escaping (Element, Element) -> Bool) {
        self.vacant = vacant
        self.less = less
    }

    var count: Int { root < 0 ? 0 : Int(size[Int(root)]) }

    private func sz(_ n: Int32) -> Int32 { n < 0 ? 0 : size[Int(n)] }

    private mutating func update(_ n: Int32) {
        size[Int(n)] = 1 + sz(left[Int(n)]) + sz(right[Int(n)])
    }

    // Every link written goes through these, so parents stay true.
    @inline(__always)
    private mutating func setLeft(_ n: Int32, _ c: Int32) {
        left[Int(n)] = c
        if c >= 0 { parent[Int(c)] = n }
    }

    @inline(__always)
    private mutating func setRight(_ n: Int32, _ c: Int32) {
        right[Int(n)] = c
        if c >= 0 { parent[Int(c)] = n }
    }

    @inline(__always)
    private mutating func setRoot(_ n: Int32) {
        root = n
        if n >= 0 { parent[Int(n)] = -1 }
    }

    /// The identity, mixed (a treap's priority: any fixed scramble of
    /// distinct numbers will do; results never depend on the shape).
    private static func hash(_ id: UInt32) -> UInt32 {
        var h = id &* 0x9E37_79B1
        h ^= h >> 15
        h = h &* 0x2C1B_3C6D
        h ^= h >> 12
        return h
    }

    /// A node's priority: its identity, scrambled (not stored: 4 bytes a node).
    @inline(__always)
    private func priority(_ n: Int32) -> UInt32 { Self.hash(ids[Int(n)]) }

    /// Gives back the room its arrays grew beyond their nodes (after a
    /// build: appending doubled them). Only without free nodes.
    mutating func shrinkToFit() {
        guard free.isEmpty, ids.capacity > ids.count else { return }
        func fit<T>(_ a: inout [T]) {
            var b: [T] = []
            b.reserveCapacity(a.count)
            b.append(contentsOf: a)
            a = b
        }
        fit(&values)
        fit(&ids)
        fit(&left)
        fit(&right)
        fit(&size)
        fit(&parent)
    }

    private mutating func newNode(_ e: Element) -> Int32 {
        if let n = free.popLast() {
            values[Int(n)] = e.values
            ids[Int(n)] = e.id
            left[Int(n)] = -1
            right[Int(n)] = -1
            size[Int(n)] = 1
            parent[Int(n)] = -1
            return n
        }
        values.append(e.values)
        ids.append(e.id)
        left.append(-1)
        right.append(-1)
        size.append(1)
        parent.append(-1)
        return Int32(ids.count - 1)
    }

    /// Splits `n` into (< e, ≥ e).
    private mutating func split(_ n: Int32, _ e: Element) -> (Int32, Int32) {
        if n < 0 { return (-1, -1) }
        if less(elementAt(Int(n)), e) {
            let (a, b) = split(right[Int(n)], e)
            setRight(n, a)
            update(n)
            return (n, b)
        } else {
            let (a, b) = split(left[Int(n)], e)
            setLeft(n, b)
            update(n)
            return (a, n)
        }
    }

    private mutating func merge(_ a: Int32, _ b: Int32) -> Int32 {
        if a < 0 { return b }
        if b < 0 { return a }
        if priority(a) > priority(b) {
            setRight(a, merge(right[Int(a)], b))
            update(a)
            return a
        } else {
            setLeft(b, merge(a, left[Int(b)]))
            update(b)
            return b
        }
    }

    /// Inserts `e` (not present) and returns its position.
    @discardableResult
    mutating func insert(_ e: Element) -> Int { insertNode(e).position }

    /// Inserts `e` (not present): its position, and its node — a handle that
    /// stays valid (``element(_:)``) until `e` is removed.
    @discardableResult
    mutating func insertNode(_ e: Element) -> (position: Int, node: Int32) {
        let (a, b) = split(root, e)
        let pos = Int(sz(a))
        let n = newNode(e)
        setRoot(merge(merge(a, n), b))
        return (pos, n)
    }

    /// The element a node handle (from ``insertNode(_:)``) holds.
    func element(_ node: Int32) -> Element { elementAt(Int(node)) }

    @inline(__always)
    private func elementAt(_ n: Int) -> Element { Element(values: values[n], id: ids[n]) }

    /// Changes what a node holds beside its order (`body` must not change
    /// how the element compares).
    mutating func modifyValues(_ node: Int32, _ body: (inout Values) -> Void) {
        body(&values[Int(node)])
    }

    /// Nodes are numbered `0 ..< nodeCapacity`; a free one holds ``Identities/none``.
    var nodeCapacity: Int { ids.count }

    /// The identity a node holds, ``Identities/none`` when it is free.
    func id(ofNode n: Int) -> UInt32 { ids[n] }

    /// Removes `e` (present) and returns the position it had.
    @discardableResult
    mutating func remove(_ e: Element) -> Int {
        let pos = rank(e)
        setRoot(removeNode(root, e))
        return pos
    }

    /// Removes the element a node handle holds and returns the position it
    /// had: its children merge into its place, sizes are fixed on the way
    /// up. No comparison.
    @discardableResult
    mutating func remove(node n: Int32) -> Int {
        let pos = rank(node: n)
        let m = merge(left[Int(n)], right[Int(n)])
        let p = parent[Int(n)]
        if p < 0 {
            setRoot(m)
        } else {
            if left[Int(p)] == n { setLeft(p, m) } else { setRight(p, m) }
            var x = p
            while x >= 0 {
                update(x)
                x = parent[Int(x)]
            }
        }
        values[Int(n)] = vacant
        ids[Int(n)] = Identities.none
        left[Int(n)] = -1
        right[Int(n)] = -1
        parent[Int(n)] = -1
        free.append(n)
        return pos
    }

    /// How many elements precede the one a node handle holds: its left
    /// subtree, and every ancestor it is right of with that one's left
    /// subtree. No comparison.
    func rank(node n: Int32) -> Int {
        var r = Int(sz(left[Int(n)]))
        var x = n
        var p = parent[Int(x)]
        while p >= 0 {
            if right[Int(p)] == x { r += Int(sz(left[Int(p)])) + 1 }
            x = p
            p = parent[Int(x)]
        }
        return r
    }

    private mutating func removeNode(_ n: Int32, _ e: Element) -> Int32 {
        if n < 0 { return -1 }
        let x = elementAt(Int(n))
        if less(e, x) {
            setLeft(n, removeNode(left[Int(n)], e))
        } else if less(x, e) {
            setRight(n, removeNode(right[Int(n)], e))
        } else {
            let m = merge(left[Int(n)], right[Int(n)])
            values[Int(n)] = vacant
            ids[Int(n)] = Identities.none
            free.append(n)
            return m
        }
        update(n)
        return n
    }

    /// How many elements precede `e`.
    func rank(_ e: Element) -> Int {
        var n = root
        var r = 0
        while n >= 0 {
            let x = elementAt(Int(n))
            if less(x, e) {
                r += Int(sz(left[Int(n)])) + 1
                n = right[Int(n)]
            } else if less(e, x) {
                n = left[Int(n)]
            } else {
                return r + Int(sz(left[Int(n)]))
            }
        }
        return r
    }

    /// How many elements, from the first, satisfy `below` (which must hold
    /// for a prefix of the order and for nothing after it): O(log n).
    func prefixCount(_ below: (Element) -> Bool) -> Int {
        var n = root
        var r = 0
        while n >= 0 {
            if below(elementAt(Int(n))) {
                r += Int(sz(left[Int(n)])) + 1
                n = right[Int(n)]
            } else {
                n = left[Int(n)]
            }
        }
        return r
    }

    /// The element at `position` (0 ..< count).
    func select(_ position: Int) -> Element {
        var n = root
        var p = Int32(position)
        while n >= 0 {
            let l = sz(left[Int(n)])
            if p < l {
                n = left[Int(n)]
            } else if p == l {
                return elementAt(Int(n))
            } else {
                p -= l + 1
                n = right[Int(n)]
            }
        }
        preconditionFailure("OrderTree.select(\(position)) out of 0..<\(count)")
    }

    /// The identities at positions `range` (clamped), in order: O(log n + k).
    func ids(_ range: Range<Int>) -> [UInt32] {
        let lo = max(0, range.lowerBound), hi = min(count, range.upperBound)
        guard lo < hi else { return [] }
        var out: [UInt32] = []
        out.reserveCapacity(hi - lo)
        // In-order walk from `lo`, with an explicit stack.
        var stack: [Int32] = []
        var n = root
        var skip = Int32(lo)
        while n >= 0 {
            let l = sz(left[Int(n)])
            if skip < l {
                stack.append(n)
                n = left[Int(n)]
            } else if skip == l {
                stack.append(n)
                break
            } else {
                skip -= l + 1
                n = right[Int(n)]
            }
        }
        while out.count < hi - lo, let top = stack.popLast() {
            out.append(ids[Int(top)])
            var m = right[Int(top)]
            while m >= 0 {
                stack.append(m)
                m = left[Int(m)]
            }
        }
        return out
    }

    /// What is wrong with the structure (sizes, parents, heap order, order
    /// of elements), for tests and the internal checks; empty when sound.
    func structureViolations() -> [String] {
        var problems: [String] = []
        var seen = 0
        var previous: Int32 = -1
        func walk(_ n: Int32, _ p: Int32) -> Int32 {
            if n < 0 { return 0 }
            seen += 1
            if parent[Int(n)] != p { problems.append("node \(n): parent \(parent[Int(n)]), linked under \(p)") }
            if p >= 0 && priority(n) > priority(p) { problems.append("node \(n): priority above its parent's") }
            let l = walk(left[Int(n)], n)
            if previous >= 0 && !less(elementAt(Int(previous)), elementAt(Int(n))) { problems.append("node \(n): out of order") }
            previous = n
            let s = 1 + l + walk(right[Int(n)], n)
            if size[Int(n)] != s { problems.append("node \(n): size \(size[Int(n)]), holds \(s)") }
            return s
        }
        _ = walk(root, -1)
        if seen + free.count != ids.count { problems.append("\(seen) linked + \(free.count) free of \(ids.count) nodes") }
        return problems
    }

    mutating func removeAll() {
        values = []
        ids = []
        left = []
        right = []
        size = []
        parent = []
        free = []
        root = -1
    }
}
