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

/// A change set whose members a caller may append unhashed: what a
/// mutation changed (`StoreChange.valueChanged`). Propagation knows that
/// each referrer it refreshes is new to the set (it refreshes each once,
/// and the written entities, the members so far, are marked done), and
/// appends it with ``insertNew(_:)``: an author's rename puts its hundred
/// posts in the set, and nobody may ask for one of them (hashing them cost
/// ~180 instructions a post). They are hashed when a caller is about to
/// look many up (``hashed(forLookups:)``) or inserts by ``insert(_:)``;
/// ``contains(_:)`` is right either way (it scans the unhashed ones).
///
/// A type apart from `IDSet`: a `StoreChange` holds eight sets, and a list
/// in each of them cost every mutation eight more releases.
///
/// Iteration is in insertion order, as `IDSet`'s.
struct ChangeSet: Sequence, ExpressibleByArrayLiteral {
    private var members = IDSet()
    /// Members after `members`'s in insertion order, not hashed yet; nil
    /// (no list: a copy retains nothing) when there are none.
    private var unhashed: [String]?

    init() {}

    init(arrayLiteral elements: String...) {
        for e in elements { insert(e) }
    }

    init<S: Sequence<String>>(_ elements: S) {
        for e in elements { insert(e) }
    }

    var count: Int { members.count + unhashedCount }

    var isEmpty: Bool { members.isEmpty }

    @inline(__always)
    func contains(_ e: String) -> Bool {
        members.contains(e) || (unhashed != nil && scanUnhashed(e))
    }

    private func scanUnhashed(_ e: String) -> Bool {
        for u in unhashed! where sameText(u, e) { return true }
        return false
    }

    @discardableResult
    mutating func insert(_ e: String) -> (inserted: Bool, memberAfterInsert: String) {
        hashAll()
        return members.insert(e)
    }

    /// Adds `e`, which the caller knows is not a member, without hashing it.
    @inline(__always)
    mutating func insertNew(_ e: String) {
        // Checked while the list is short (a long one would make the check quadratic).
        assert(unhashedCount > 64 || !contains(e), "insertNew of a member")
        if members.isEmpty {
            members.insert(e)
        } else if unhashed == nil {
            unhashed = [e]
        } else {
            unhashed!.append(e)
        }
    }

    /// Room for `n` more members added by ``insertNew(_:)``.
    mutating func reserveNew(_ n: Int) {
        if unhashed == nil { unhashed = [] }
        unhashed!.reserveCapacity(unhashed!.count + n)
    }

    /// Members appended by ``insertNew(_:)`` and not hashed yet.
    var unhashedCount: Int { unhashed?.count ?? 0 }

    /// Hashes the members ``insertNew(_:)`` appended.
    @inline(__always)
    mutating func hashAll() {
        if unhashed != nil { hashUnhashed() }
    }

    private mutating func hashUnhashed() {
        let list = unhashed!
        unhashed = nil
        members.reserveCapacity(members.count + list.count)
        for u in list { members.insert(u) }
    }

    /// The members as an `IDSet`, hashed throughout when `lookups` calls of
    /// `contains` would cost more scanning the unhashed members than hashing
    /// them (a scan compares ~6 instructions a member; a hash costs ~20 of
    /// those); nil when scanning costs less.
    @inline(__always)
    func hashed(forLookups lookups: @autoclosure () -> Int) -> IDSet? {
        guard unhashedCount > 8 && lookups() > 16 else { return nil }
        return hashedCopy()
    }

    private func hashedCopy() -> IDSet {
        var s = self
        s.hashAll()
        return s.members
    }

    /// The members as an `IDSet` (hashing the unhashed ones in a copy).
    var asIDSet: IDSet { unhashed == nil ? members : hashedCopy() }

    mutating func formUnion<S: Sequence<String>>(_ other: S) {
        for e in other { insert(e) }
    }

    func union<S: Sequence<String>>(_ other: S) -> IDSet { asIDSet.union(other) }

    struct Iterator: IteratorProtocol {
        fileprivate var hashed: IDSet.Iterator
        fileprivate let unhashed: [String]
        fileprivate var i = 0

        mutating func next() -> String? {
            if let e = hashed.next() { return e }
            guard i < unhashed.count else { return nil }
            defer { i += 1 }
            return unhashed[i]
        }
    }

    func makeIterator() -> Iterator {
        Iterator(hashed: members.makeIterator(), unhashed: unhashed ?? [])
    }

    var underestimatedCount: Int { count }
}

extension ChangeSet: Equatable {
    static func == (a: ChangeSet, b: ChangeSet) -> Bool {
        a.count == b.count && a.asIDSet == b.asIDSet
    }
}
