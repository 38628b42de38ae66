/// A JSON value as Concord keeps it in memory.
///
/// Objects keep their members in document order (the order a client sent
/// them is the order it gets them back). Numbers keep their exact lexeme, so
/// a value round-trips byte for byte; equality compares numbers by value.
/// Arrays and objects are copy-on-write, so sharing a subtree between many
/// trees (an entity nested in many documents) costs one reference.
public enum JSON: Sendable {
    case null
    case bool(Bool)
    case number(JSONNumber)
    case string(String)
    case array([JSON])
    case object(JSONObject)
}

/// An object's members in document order. A duplicated name never survives
/// parsing: the last value wins, at the position of the first occurrence.
public struct JSONObject: Sendable {
    public var members: [Member]

    public struct Member: Sendable {
        public var key: String
        public var value: JSON
        @inlinable public init(key: String, value: JSON) {
            self.key = key
            self.value = value
        }
    }

    @inlinable public init() { members = [] }
    @inlinable public init(_ members: [Member]) { self.members = members }

    @inlinable public var count: Int { members.count }

    /// The value of member `key`, or nil.
    @inlinable public subscript(key: String) -> JSON? {
        get {
            // By index (no member copied out), lengths first (a mismatch
            // of small strings is otherwise a call into the runtime).
            let ms = members
            for i in ms.indices where sameText(ms[i].key, key) { return ms[i].value }
            return nil
        }
        set {
            if let i = members.firstIndex(where: { sameText($0.key, key) }) {
                if let v = newValue { members[i].value = v } else { members.remove(at: i) }
            } else if let v = newValue {
                members.append(Member(key: key, value: v))
            }
        }
    }

    /// Whether some member's value is an object or an array (read in place).
    @inlinable public var holdsContainer: Bool {
        members.withUnsafeBufferPointer { b in b.contains { $0.value.isContainer } }
    }

    /// Member `key` set to `value` (added when absent), unless it already
    /// holds a value written as the same bytes: then nothing is written,
    /// and a member list shared with another value is not copied (a merge
    /// that gives an entity's members as they are stored).
    @inlinable public mutating func merge(_ key: String, _ value: JSON) {
        let found = members.withUnsafeBufferPointer { b -> (index: Int, same: Bool)? in
            for i in b.indices where sameText(b[i].key, key) { return (i, b[i].value.hasSameEncoding(as: value)) }
            return nil
        }
        if let found {
            if !found.same { members[found.index].value = value }
        } else {
            members.append(Member(key: key, value: value))
        }
    }
}

/// A JSON number kept as its RFC 8259 lexeme.
public struct JSONNumber: Sendable, CustomStringConvertible {
    /// The exact text of the number (always valid RFC 8259 number syntax).
    public let text: String

    /// Creates a number from a lexeme the caller guarantees to be valid JSON number syntax.
    public init(unchecked text: String) { self.text = text }
    public init(_ value: Int) { self.text = String(value) }

    public var description: String { text }

    /// True when the lexeme has neither fraction nor exponent.
    public var isInteger: Bool {
        // Contiguous bytes (no per-character String iteration): this runs
        // on every comparison of two different numbers.
        if let r = text.utf8.withContiguousStorageIfAvailable({ Self.integerLexeme($0) }) { return r }
        for u in text.utf8 where u == UInt8(ascii: ".") || u == UInt8(ascii: "e") || u == UInt8(ascii: "E") {
            return false
        }
        return true
    }

    @inline(__always)
    static func integerLexeme(_ b: UnsafeBufferPointer<UInt8>) -> Bool {
        for u in b where u == UInt8(ascii: ".") || u == UInt8(ascii: "e") || u == UInt8(ascii: "E") { return false }
        return true
    }

    /// The integer's canonical decimal text ("-0" becomes "0"), or nil when not an integer.
    public var integerText: String? {
        guard isInteger else { return nil }
        return text == "-0" ? "0" : text
    }

    /// The value as an Int when it is an integer that fits.
    public var intValue: Int? { isInteger ? Int(text) : nil }

    /// The nearest Double. An integer lexeme of up to 15 digits (exact in a
    /// Double) is read from its bytes, without the C library's `strtod`
    /// (the range index keys every changed entity's value with it).
    public var doubleValue: Double {
        if let small = text.utf8.withContiguousStorageIfAvailable({ Self.smallInteger($0) }), let small {
            return Double(small)
        }
        return Double(text) ?? 0
    }

    /// The value when it is an integer of at most 15 digits (exact), else
    /// nil: ordering two of them is ordering their values.
    @inlinable
    public var smallIntegerValue: Int? {
        text.utf8.withContiguousStorageIfAvailable({ Self.smallInteger($0) }) ?? nil
    }

    @inline(__always) @usableFromInline
    static func smallInteger(_ b: UnsafeBufferPointer<UInt8>) -> Int? {
        var i = 0
        let negative = b.first == UInt8(ascii: "-")
        if negative { i = 1 }
        guard b.count - i >= 1, b.count - i <= 15 else { return nil }
        var v = 0
        while i < b.count {
            let d = b[i] &- UInt8(ascii: "0")
            guard d < 10 else { return nil }
            v = v * 10 + Int(d)
            i += 1
        }
        return negative ? -v : v
    }

    /// Orders two numbers by their exact decimal values: -1, 0 or 1.
    public func compareByValue(_ other: JSONNumber) -> Int {
        if isInteger && other.isInteger, let a = Int(text), let b = Int(other.text) {
            return a < b ? -1 : (a > b ? 1 : 0)
        }
        return Decimal10(text).compare(Decimal10(other.text))
    }

    /// Numeric equality on the exact decimal values (no rounding through Double).
    public func isEqualByValue(_ other: JSONNumber) -> Bool {
        if text == other.text { return true }
        // Two integers have one canonical spelling each (JSON forbids leading
        // zeros), so different texts mean different values — except -0 and 0.
        if isInteger && other.isInteger {
            return (text == "-0" || text == "0") && (other.text == "-0" || other.text == "0")
        }
        return Decimal10(text) == Decimal10(other.text)
    }
}

/// An exact decimal: sign, significant digits without leading/trailing zeros, exponent.
struct Decimal10: Equatable {
    var negative: Bool
    var digits: [UInt8]
    var exponent: Int

    /// -1, 0 or 1 by value. The value is 0.d1d2…dn × 10^(n + exponent).
    func compare(_ o: Decimal10) -> Int {
        if digits.isEmpty || o.digits.isEmpty {
            if digits.isEmpty && o.digits.isEmpty { return 0 }
            if digits.isEmpty { return o.negative ? 1 : -1 }
            return negative ? -1 : 1
        }
        if negative != o.negative { return negative ? -1 : 1 }
        let sign = negative ? -1 : 1
        let magA = digits.count + exponent, magB = o.digits.count + o.exponent
        if magA != magB { return magA < magB ? -sign : sign }
        for i in 0..<max(digits.count, o.digits.count) {
            let a = i < digits.count ? digits[i] : 0
            let b = i < o.digits.count ? o.digits[i] : 0
            if a != b { return a < b ? -sign : sign }
        }
        return 0
    }

    init(_ text: String) {
        var neg = false
        var mantissa: [UInt8] = []
        var pointShift = 0
        var exp = 0
        var seenPoint = false
        var expNeg = false
        var inExp = false
        for u in text.utf8 {
            switch u {
            case UInt8(ascii: "-"):
                if inExp { expNeg = true } else { neg = true }
            case UInt8(ascii: "+"):
                break
            case UInt8(ascii: "."):
                seenPoint = true
            case UInt8(ascii: "e"), UInt8(ascii: "E"):
                inExp = true
            default:
                let d = u &- UInt8(ascii: "0")
                if inExp {
                    // Saturate absurd exponents; equality on them is still exact enough.
                    if exp < 1_000_000_000 { exp = exp * 10 + Int(d) }
                } else {
                    mantissa.append(d)
                    if seenPoint { pointShift += 1 }
                }
            }
        }
        if expNeg { exp = -exp }
        var start = 0
        while start < mantissa.count && mantissa[start] == 0 { start += 1 }
        var end = mantissa.count
        var trailing = 0
        while end > start && mantissa[end - 1] == 0 { end -= 1; trailing += 1 }
        digits = Array(mantissa[start..<end])
        if digits.isEmpty {
            negative = false
            exponent = 0
        } else {
            negative = neg
            exponent = exp - pointShift + trailing
        }
    }
}

extension JSON: Equatable {
    /// Deep JSON equality: member order does not matter, numbers compare by value.
    ///
    /// One `switch` per side, members read in place through their buffers:
    /// a `switch` over the pair `(lhs, rhs)` copied both values into it, and
    /// reading `members[i]` copied each member out (~10 copies and as many
    /// destroys per update, comparing a document with its previous version).
    public static func == (lhs: JSON, rhs: JSON) -> Bool { same(lhs, rhs, exact: false) }

    /// `==` (`exact` false), or ``hasSameEncoding(as:)`` (true: numbers
    /// spelled alike, members in the same order).
    @inline(__always)
    static func same(_ lhs: JSON, _ rhs: JSON, exact: Bool) -> Bool {
        switch lhs {
        case .null:
            if case .null = rhs { return true }
        case .bool(let a):
            if case .bool(let b) = rhs { return a == b }
        case .number(let a):
            if case .number(let b) = rhs { return exact ? sameText(a.text, b.text) : a.isEqualByValue(b) }
        case .string(let a):
            if case .string(let b) = rhs { return sameText(a, b) }
        case .array(let a):
            if case .array(let b) = rhs { return sameElements(a, b, exact: exact) }
        case .object(let a):
            if case .object(let b) = rhs { return exact ? sameEncodedMembers(a.members, b.members) : a == b }
        }
        return false
    }

    private static func sameElements(_ a: [JSON], _ b: [JSON], exact: Bool) -> Bool {
        a.withUnsafeBufferPointer { x in
            b.withUnsafeBufferPointer { y in
                guard x.count == y.count else { return false }
                // Copy-on-write sharing: one buffer is one value (the common
                // case when comparing a tree with its previous version).
                if x.count == 0 || x.baseAddress == y.baseAddress { return true }
                for i in 0 ..< x.count where !(exact ? sameEncoding(x[i], y[i]) : x[i] == y[i]) { return false }
                return true
            }
        }
    }

    /// Members in the same order, each spelled alike (`JSONObject ==` also
    /// matches members out of order).
    private static func sameEncodedMembers(_ a: [JSONObject.Member], _ b: [JSONObject.Member]) -> Bool {
        a.withUnsafeBufferPointer { x in
            b.withUnsafeBufferPointer { y in
                guard x.count == y.count else { return false }
                if x.count == 0 || x.baseAddress == y.baseAddress { return true }
                for i in 0 ..< x.count where !sameText(x[i].key, y[i].key) || !sameEncoding(x[i].value, y[i].value) {
                    return false
                }
                return true
            }
        }
    }
}

extension JSON {
    /// Whether `JSONWriter` writes the two values as the same bytes: equal,
    /// with members in the same order and numbers spelled alike (`==`
    /// ignores both). A value can then stand for the other in a tree whose
    /// encoding must not change.
    @inlinable
    public func hasSameEncoding(as other: JSON) -> Bool { Self.sameEncoding(self, other) }

    /// Written as `==` is (one `switch` per side, elements read in place
    /// through their buffers): copying each member out cost ~300
    /// instructions for a small object.
    @usableFromInline
    static func sameEncoding(_ lhs: JSON, _ rhs: JSON) -> Bool { same(lhs, rhs, exact: true) }
}

/// How two values compare: written as the same bytes, equal (`==`) but
/// written otherwise, or different.
public enum JSONLikeness: Sendable, Equatable {
    case sameEncoding, equal, different
}

extension JSON {
    /// ``hasSameEncoding(as:)`` and `==` in one pass over two objects
    /// whose members are in the same order (a stored entity and its new
    /// version): the members that are spelled alike are compared once, not
    /// again by `==` when a later one differs. Other values, and objects
    /// whose members are in another order, are compared by both.
    public func likeness(to other: JSON) -> JSONLikeness {
        guard case .object(let a) = self, case .object(let b) = other else {
            return Self.sameEncoding(self, other) ? .sameEncoding : (self == other ? .equal : .different)
        }
        return a.members.withUnsafeBufferPointer { x in
            b.members.withUnsafeBufferPointer { y in
                // Equal objects have as many members (the parser keeps one per name).
                guard x.count == y.count else { return .different }
                if x.count == 0 || x.baseAddress == y.baseAddress { return .sameEncoding }
                var exact = true
                for i in 0 ..< x.count {
                    guard sameText(x[i].key, y[i].key) else { return a == b ? .equal : .different }
                    if exact && Self.sameEncoding(x[i].value, y[i].value) { continue }
                    guard x[i].value == y[i].value else { return .different }
                    exact = false
                }
                return exact ? .sameEncoding : .equal
            }
        }
    }
}

/// True when two non-empty arrays share one buffer (so they are equal).
@inlinable @inline(__always)
public func sameBuffer<T>(_ a: [T], _ b: [T]) -> Bool {
    guard !a.isEmpty else { return false }
    return a.withUnsafeBufferPointer { x in b.withUnsafeBufferPointer { y in x.baseAddress == y.baseAddress } }
}

extension JSONObject: Equatable {
    public static func == (lhs: JSONObject, rhs: JSONObject) -> Bool {
        lhs.members.withUnsafeBufferPointer { a in
            rhs.members.withUnsafeBufferPointer { b in
                guard a.count == b.count else { return false }
                if a.count == 0 || a.baseAddress == b.baseAddress { return true }
                // Same order is the common case: a linear pass decides it.
                var sameOrder = true
                for i in 0 ..< a.count where !sameText(a[i].key, b[i].key) {
                    sameOrder = false
                    break
                }
                if sameOrder {
                    for i in 0 ..< a.count where !(a[i].value == b[i].value) { return false }
                    return true
                }
                if a.count <= 16 {
                    outer: for i in 0 ..< a.count {
                        for j in 0 ..< b.count where sameText(b[j].key, a[i].key) {
                            if !(a[i].value == b[j].value) { return false }
                            continue outer
                        }
                        return false
                    }
                    return true
                }
                var index: [String: Int] = [:]
                index.reserveCapacity(b.count)
                for j in 0 ..< b.count { index[b[j].key] = j }
                for i in 0 ..< a.count {
                    guard let j = index[a[i].key], a[i].value == b[j].value else { return false }
                }
                return true
            }
        }
    }
}

extension JSON {
    @inlinable public var objectValue: JSONObject? {
        if case .object(let o) = self { return o }
        return nil
    }
    @inlinable public var arrayValue: [JSON]? {
        if case .array(let a) = self { return a }
        return nil
    }
    @inlinable public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }
    @inlinable public var boolValue: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }
    @inlinable public var numberValue: JSONNumber? {
        if case .number(let n) = self { return n }
        return nil
    }
    @inlinable public var isNull: Bool {
        if case .null = self { return true }
        return false
    }
    /// True for null, booleans, numbers and strings.
    @inlinable public var isScalar: Bool {
        switch self {
        case .array, .object: return false
        default: return true
        }
    }

    /// Member lookup on objects; nil for anything else.
    @inlinable public subscript(key: String) -> JSON? {
        if case .object(let o) = self { return o[key] }
        return nil
    }

    /// The identity an object carries under `idKey`: a non-empty string, or an
    /// integer (as canonical text). Anything else means the object is a plain value.
    /// An object or an array (what may hold an identity below it).
    @inlinable public var isContainer: Bool {
        switch self {
        case .object, .array: return true
        default: return false
        }
    }

    @inlinable public func identity(idKey: String) -> String? {
        guard case .object(let o) = self else { return nil }
        return o.identity(idKey: idKey)
    }

    public static func int(_ v: Int) -> JSON { .number(JSONNumber(v)) }
}

extension JSONObject {
    @inlinable public func identity(idKey: String) -> String? {
        // By index: the members are not copied out one by one.
        let ms = members
        for i in ms.indices where sameText(ms[i].key, idKey) {
            switch ms[i].value {
            case .string(let s): return s.isEmpty ? nil : s
            case .number(let n): return n.integerText
            default: return nil
            }
        }
        return nil
    }
}

extension JSON: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int) { self = .int(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: JSON...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSON)...) {
        self = .object(JSONObject(elements.map { JSONObject.Member(key: $0.0, value: $0.1) }))
    }
}

extension JSON {
    /// True when the value nests deeper than `limit` levels (an object or
    /// array is one level more than its deepest member; a scalar is 0). The
    /// walk stops as soon as it knows, so its recursion never goes deeper
    /// than `limit + 1`.
    /// How deeply the value nests (an object or array is one level more than
    /// its deepest member; a scalar is 0), or `cap` when it nests at least
    /// that deeply: the walk never recurses deeper than `cap`.
    // The walks below read each child in place through the container's
    // buffer: `for m in o.members` copied every member out (a retain and
    // a release of its key and its value each), most of the walk's cost.
    public func height(cappedAt cap: Int) -> Int {
        guard cap > 0 else { return 0 }
        switch self {
        case .object(let o):
            return o.members.withUnsafeBufferPointer { b in
                var h = 0
                var i = 0
                while i < b.count && h < cap - 1 {
                    h = Swift.max(h, b[i].value.height(cappedAt: cap - 1))
                    i += 1
                }
                return h + 1
            }
        case .array(let a):
            return a.withUnsafeBufferPointer { b in
                var h = 0
                var i = 0
                while i < b.count && h < cap - 1 {
                    h = Swift.max(h, b[i].height(cappedAt: cap - 1))
                    i += 1
                }
                return h + 1
            }
        default:
            return 0
        }
    }

    public func nests(deeperThan limit: Int) -> Bool {
        switch self {
        case .object(let o):
            if limit < 1 { return true }
            return o.members.withUnsafeBufferPointer { b in
                for i in b.indices where b[i].value.nests(deeperThan: limit - 1) { return true }
                return false
            }
        case .array(let a):
            if limit < 1 { return true }
            return a.withUnsafeBufferPointer { b in
                for i in b.indices where b[i].nests(deeperThan: limit - 1) { return true }
                return false
            }
        default:
            return false
        }
    }
}

/// Whether two texts (member names, string values) are the same bytes.
///
/// JSON compares strings by their code points, not as Swift's `==` does
/// (canonical equivalence: `"é"` precomposed equals `"e"` + U+0301 there,
/// which would make a write that changes one into the other no change at
/// all). And most comparisons are decided by the strings' two words: a
/// string of at most 15 ASCII bytes is held in them — the bytes, zero past
/// the count, and a discriminator byte (immortal, ASCII, small, the
/// count) — so equal words are equal texts, and two such strings with
/// different words differ (`"model"` against `"token"`: two compares where
/// the runtime's comparison costs ~60 instructions). The rest compare
/// lengths, then bytes.
@inlinable @inline(__always)
public func sameText(_ a: String, _ b: String) -> Bool {
    let x = unsafeBitCast(a, to: (UInt64, UInt64).self)
    let y = unsafeBitCast(b, to: (UInt64, UInt64).self)
    if x.0 == y.0 && x.1 == y.1 { return true }
    // Top three bits of the second word: immortal, ASCII, small.
    if (x.1 & y.1) >> 61 == 0b111 { return false }
    return sameBytes(a, b)
}

/// Byte equality of two strings: lengths, then eight bytes at a time.
@usableFromInline
func sameBytes(_ a: String, _ b: String) -> Bool {
    guard a.utf8.count == b.utf8.count else { return false }
    var a = a, b = b
    return a.withUTF8 { p in
        b.withUTF8 { q in
            let n = p.count
            guard n > 0 else { return true }
            let x = UnsafeRawPointer(p.baseAddress!), y = UnsafeRawPointer(q.baseAddress!)
            var i = 0
            while i + 8 <= n {
                if x.loadUnaligned(fromByteOffset: i, as: UInt64.self) != y.loadUnaligned(fromByteOffset: i, as: UInt64.self) { return false }
                i += 8
            }
            while i < n {
                if p[i] != q[i] { return false }
                i += 1
            }
            return true
        }
    }
}
