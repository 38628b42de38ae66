import ConcordJSON

/// Who holds one entity, in the store's referrer indexes: holder identity
/// → a value (the holder's record and count, or a document's count). The
/// first holder is kept inline and the others in an `IDTable`, so an
/// entity held once (most are) costs no allocation, and no holder is
/// hashed with `Hasher`'s SipHash (a `[String: …]` cost ~200 instructions
/// per hash, twice for a lookup and a write).
///
/// Iteration is the first holder, then the others in the table's order:
/// the same on every run for the same operations (a `Dictionary`'s order
/// changes with the process's seed). Invariant: `first` is nil only when
/// the whole set is empty.
struct Holders<Value>: Sequence {
    private var first: (key: String, value: Value)?
    private var rest = IDTable<Value>()

    init() {}

    var isEmpty: Bool { first == nil }
    var count: Int { first == nil ? 0 : 1 + rest.count }

    func value(_ key: String) -> Value? {
        guard let f = first else { return nil }
        if sameText(f.key, key) { return f.value }
        return rest.isEmpty ? nil : rest[key]
    }

    /// Changes the value under `key` in place (`initial` first when absent),
    /// and removes the key when `body` returns false.
    mutating func modify(_ key: String, default initial: @autoclosure () -> Value, _ body: (inout Value) -> Bool) {
        guard var f = first else {
            var v = initial()
            if body(&v) { first = (key, v) }
            return
        }
        if sameText(f.key, key) {
            first = nil  // the value is changed unshared
            if body(&f.value) {
                first = f
            } else if rest.count > 0 {
                // The last of the others moves inline.
                let k = rest.key(at: rest.count - 1)
                first = (k, rest.removeValue(forKey: k)!)
            }
            return
        }
        rest.modify(key, default: initial(), body)
    }

    /// Calls `body` with each holder in iteration order, read in place.
    @inline(__always)
    func forEach(_ body: (String, Value) -> Void) {
        guard let f = first else { return }
        body(f.key, f.value)
        rest.forEachEntry(body)
    }

    /// The first word of each holder's value past the first, read in place
    /// (``IDTable/forEachFirstWord(_:)``): for the referrer index, the
    /// holding records' addresses, to prefetch.
    @inline(__always)
    func forEachFirstWordPastTheFirst(_ body: (UInt) -> Void) { rest.forEachFirstWord(body) }

    struct Iterator: IteratorProtocol {
        fileprivate var first: (key: String, value: Value)?
        fileprivate var rest: IDTable<Value>.Iterator

        mutating func next() -> (key: String, value: Value)? {
            if let f = first {
                first = nil
                return f
            }
            return rest.next()
        }
    }

    func makeIterator() -> Iterator { Iterator(first: first, rest: rest.makeIterator()) }
    var underestimatedCount: Int { count }
}
