import ConcordJSON

/// A set of identities (entity ids, document keys, collection names) that
/// holds its first member inline and hashes only from the second: what one
/// mutation changed is almost always one entity and one document, and a
/// `Set<String>` cost an allocation and a hash (~300 instructions) per
/// member for each of `StoreChange`'s sets. Membership of the inline one is
/// an equality test (a small `String` compares as two words); the others
/// are in an `IDTable` (a cheaper hash than `Set`'s).
///
/// Iteration is in insertion order (the same on every run), but callers
/// that emit output sort first. No removal: a change set only grows.
struct IDSet: Sequence, ExpressibleByArrayLiteral {
    private var first: String?
    private var rest = IDTable<Void>()

    init() {}

    init(arrayLiteral elements: String...) {
        for e in elements { insert(e) }
    }

    init<S: Sequence<String>>(_ elements: S) {
        for e in elements { insert(e) }
    }

    var count: Int { first == nil ? 0 : 1 + rest.count }

    var isEmpty: Bool { first == nil }

    @inline(__always)
    func contains(_ e: String) -> Bool {
        guard let first else { return false }
        return sameText(first, e) || (!rest.isEmpty && rest.contains(e))
    }

    @discardableResult
    mutating func insert(_ e: String) -> (inserted: Bool, memberAfterInsert: String) {
        guard let f = first else {
            first = e
            return (true, e)
        }
        if sameText(f, e) { return (false, f) }
        return (rest.insert(e, ()), e)
    }

    mutating func formUnion<S: Sequence<String>>(_ other: S) {
        for e in other { insert(e) }
    }

    func union<S: Sequence<String>>(_ other: S) -> IDSet {
        var u = self
        u.formUnion(other)
        return u
    }

    mutating func reserveCapacity(_ n: Int) {
        if n > 1 { rest.reserveCapacity(n - 1) }
    }

    struct Iterator: IteratorProtocol {
        fileprivate var first: String?
        fileprivate let rest: IDTable<Void>
        fileprivate var i = 0

        mutating func next() -> String? {
            if let e = first {
                first = nil
                return e
            }
            guard i < rest.count else { return nil }
            defer { i += 1 }
            return rest.key(at: i)
        }
    }

    func makeIterator() -> Iterator {
        Iterator(first: first, rest: rest)
    }

    var underestimatedCount: Int { count }
}

extension IDSet: Equatable {
    static func == (a: IDSet, b: IDSet) -> Bool {
        a.count == b.count && a.allSatisfy { b.contains($0) }
    }
}
