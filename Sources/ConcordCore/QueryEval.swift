import ConcordJSON
import ConcordProtocol

/// A sort member's value, prepared once for the many comparisons of a tree
/// walk: integers that fit are compared as Int, strings by their bytes.
enum SortValue {
    case missing
    case null
    case bool(Bool)
    case int(Int)
    /// A number that is not an Int (fraction, exponent, or too large).
    case number(JSONNumber)
    case string(String)
    case array([JSON])
    case object
    /// Several order keys' values together (``SortKey``); never from JSON.
    case keys([SortValue])

    init(_ v: JSON?) {
        guard let v else {
            self = .missing
            return
        }
        switch v {
        case .null: self = .null
        case .bool(let b): self = .bool(b)
        case .number(let n):
            if let i = n.smallIntegerValue {
                self = .int(i)
            } else if n.isInteger, let i = Int(n.text) {
                self = .int(i)
            } else {
                self = .number(n)
            }
        case .string(let s): self = .string(s)
        case .array(let a): self = .array(a)
        case .object: self = .object
        }
    }

    private var rank: Int {
        switch self {
        case .missing: return 0
        case .null: return 1
        case .bool(let b): return b ? 3 : 2
        case .int, .number: return 4
        case .string: return 5
        case .array: return 6
        case .object: return 7
        case .keys: return 8
        }
    }

    /// The order of §3.1: -1, 0 or 1.
    static func compare(_ a: SortValue, _ b: SortValue) -> Int {
        // Two integers (dates, counts) without the tuple below, which copies both values.
        if case .int(let x) = a, case .int(let y) = b { return x < y ? -1 : (x > y ? 1 : 0) }
        switch (a, b) {
        case let (.string(x), .string(y)): return QueryEval.compareStrings(x, y)
        default: break
        }
        let ra = a.rank, rb = b.rank
        if ra != rb { return ra < rb ? -1 : 1 }
        switch (a, b) {
        case let (.number(x), .number(y)): return x.compareByValue(y)
        case let (.int(x), .number(y)): return JSONNumber(x).compareByValue(y)
        case let (.number(x), .int(y)): return x.compareByValue(JSONNumber(y))
        case let (.array(x), .array(y)): return QueryEval.compare(.array(x), .array(y))
        default: return 0
        }
    }
}

/// An entity's sort values in one ``SortValue`` (24 bytes, no array of its
/// own for the common single-key order): one key's value as it is, several
/// as `.keys` (a case no JSON value makes).
struct SortKey {
    var packed: SortValue = .missing

    init() {}

    init(_ values: [SortValue]) {
        switch values.count {
        case 0: packed = .missing
        case 1: packed = values[0]
        default: packed = .keys(values)
        }
    }

    subscript(i: Int) -> SortValue {
        if case .keys(let all) = packed { return all[i] }
        return packed
    }
}

/// Evaluating queries on materialized values (PROTOCOL.md §3.1).
enum QueryEval {
    /// The value at `path`, reading through objects only (nested entities are
    /// materialized in the stored value); nil when a member is missing or a
    /// step is not an object.
    static func value(_ v: JSON, _ path: QueryPath) -> JSON? {
        // Read in place, one step per member, and only the value found is
        // copied out: a walk that kept the current value in a variable
        // copied (and destroyed) every value on the way (~170 instructions
        // for `author.id`; the views' conditions and sort keys read a path
        // per candidate view of each changed entity).
        path.withUnsafeBufferPointer { names in
            names.isEmpty ? v : member(of: v, names, 0)
        }
    }

    private static func member(of v: JSON, _ names: UnsafeBufferPointer<String>, _ i: Int) -> JSON? {
        guard case .object(let o) = v else { return nil }
        return o.members.withUnsafeBufferPointer { ms in
            let name = names[i]
            for j in ms.indices where sameText(ms[j].key, name) {
                return i + 1 == names.count ? ms[j].value : member(of: ms[j].value, names, i + 1)
            }
            return nil
        }
    }

    /// Strings by code point: UTF-8 byte order is code point order.
    @inline(never)
    static func compareStrings(_ a: String, _ b: String) -> Int {
        // Two small ASCII strings (identities such as "Post:12345") hold
        // their bytes in their two words, zero past the count: compared as
        // big-endian words, then by count. Lending the bytes (`withUTF8`)
        // cost ~150 instructions a pair.
        let x = unsafeBitCast(a, to: (UInt64, UInt64).self)
        let y = unsafeBitCast(b, to: (UInt64, UInt64).self)
        // Top three bits of the second word: immortal, ASCII, small (as `sameText`).
        if (x.1 & y.1) >> 61 == 0b111 {
            let a0 = x.0.byteSwapped, b0 = y.0.byteSwapped
            if a0 != b0 { return a0 < b0 ? -1 : 1 }
            let a1 = (x.1 & 0x00FF_FFFF_FFFF_FFFF).byteSwapped, b1 = (y.1 & 0x00FF_FFFF_FFFF_FFFF).byteSwapped
            if a1 != b1 { return a1 < b1 ? -1 : 1 }
            let ca = (x.1 >> 56) & 0xF, cb = (y.1 >> 56) & 0xF
            return ca == cb ? 0 : (ca < cb ? -1 : 1)
        }
        return compareUTF8(a, b)
    }

    /// ``compareStrings(_:_:)`` by lending both strings' bytes.
    static func compareUTF8(_ a: String, _ b: String) -> Int {
        var a = a, b = b
        return a.withUTF8 { x in b.withUTF8 { y in compareBytes(x, y) } }
    }

    @inline(__always)
    private static func compareBytes(_ x: UnsafeBufferPointer<UInt8>, _ y: UnsafeBufferPointer<UInt8>) -> Int {
        let n = min(x.count, y.count)
        var i = 0
        while i < n {
            let p = x[i], q = y[i]
            if p != q { return p < q ? -1 : 1 }
            i += 1
        }
        return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
    }

    /// The rank of a value's kind: missing < null < false < true < numbers < strings < arrays < objects.
    private static func kindRank(_ v: JSON?) -> Int {
        guard let v else { return 0 }
        switch v {
        case .null: return 1
        case .bool(let b): return b ? 3 : 2
        case .number: return 4
        case .string: return 5
        case .array: return 6
        case .object: return 7
        }
    }

    /// The order of §3.1: -1, 0 or 1. Arrays element by element (a prefix
    /// first); objects all rank equal.
    static func compare(_ a: JSON?, _ b: JSON?) -> Int {
        let ka = kindRank(a), kb = kindRank(b)
        if ka != kb { return ka < kb ? -1 : 1 }
        switch (a, b) {
        case let (.number(x)?, .number(y)?): return x.compareByValue(y)
        case let (.string(x)?, .string(y)?): return compareStrings(x, y)
        case let (.array(x)?, .array(y)?):
            for i in 0..<min(x.count, y.count) {
                let c = compare(x[i], y[i])
                if c != 0 { return c }
            }
            return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
        default:
            return 0
        }
    }

    /// Whether `v` satisfies `c`.
    static func matches(_ v: JSON, _ c: QueryCondition) -> Bool {
        switch c {
        case .compare(let path, let op, let arg):
            return test(value(v, path), op, arg)
        case .oneOf(let path, let list):
            guard let x = value(v, path) else { return false }
            return list.contains { $0 == x }
        case .exists(let path, let want):
            return (value(v, path) != nil) == want
        case .contains(let path, let arg):
            guard case .array(let list)? = value(v, path) else { return false }
            return list.contains { $0 == arg }
        case .prefix(let path, let p):
            guard case .string(let s)? = value(v, path) else { return false }
            return s.utf8.starts(with: p.utf8)
        case .all(let list):
            return list.allSatisfy { matches(v, $0) }
        case .any(let list):
            return list.contains { matches(v, $0) }
        case .not(let inner):
            return !matches(v, inner)
        }
    }

    /// Whether the value at a path (nil: absent) compares with `arg` as `op` says.
    static func test(_ x: JSON?, _ op: QueryCondition.Comparison, _ arg: JSON) -> Bool {
        switch op {
        case .eq: return x.map { $0 == arg } ?? false
        case .ne: return x.map { !($0 == arg) } ?? true
        case .lt, .lte, .gt, .gte:
            guard let x, let r = ordered(x, arg) else { return false }
            switch op {
            case .lt: return r < 0
            case .lte: return r <= 0
            case .gt: return r > 0
            default: return r >= 0
            }
        }
    }

    /// Order between two numbers or two strings; nil for any other pair.
    private static func ordered(_ a: JSON, _ b: JSON) -> Int? {
        switch (a, b) {
        case let (.number(x), .number(y)): return x.compareByValue(y)
        case let (.string(x), .string(y)): return compareStrings(x, y)
        default: return nil
        }
    }

    /// The text an equality index files a scalar under (numbers by value:
    /// integers canonically); nil for arrays and objects, which are not indexed.
    static func indexKey(_ v: JSON) -> String? {
        switch v {
        case .null: return "n"
        case .bool(let b): return b ? "t" : "f"
        case .string(let s): return "s" + s
        case .number(let n):
            if let t = n.integerText { return "i" + t }
            // Other spellings by exact value: 1.0 and 1e0 file with 1, 1.50 with 1.5.
            return Decimal10Key.text(n.text)
        case .array, .object: return nil
        }
    }

    /// The text the equality index files any value under: ``indexKey(_:)``
    /// for a scalar; for an array or object a text built from its parts'
    /// keys (object members sorted by name), so that values equal as JSON
    /// (numbers by value, members in any order, strings equal as Swift
    /// strings) are filed together. The index only finds candidates — each
    /// still tests its condition — so what matters is that equal values
    /// never file apart: the parts are Swift strings joined by ASCII marks
    /// that no Unicode normalization composes with, escaped inside names
    /// and strings.
    static func filingKey(_ v: JSON) -> String {
        if let k = indexKey(v) { return k }
        var out = ""
        appendFilingKey(v, &out)
        return out
    }

    private static func appendFilingKey(_ v: JSON, _ out: inout String) {
        switch v {
        case .array(let list):
            out += "a["
            for (i, x) in list.enumerated() {
                if i > 0 { out += "," }
                appendFilingKey(x, &out)
            }
            out += "]"
        case .object(let o):
            out += "o{"
            for (i, m) in o.members.sorted(by: { $0.key < $1.key }).enumerated() {
                if i > 0 { out += "," }
                appendEscaped(m.key, &out)
                out += ":"
                appendFilingKey(m.value, &out)
            }
            out += "}"
        default:
            appendEscaped(indexKey(v) ?? "", &out)
        }
    }

    private static func appendEscaped(_ s: String, _ out: inout String) {
        for u in s.unicodeScalars {
            switch u {
            case "\\", ",", ":", "[", "]", "{", "}": out.unicodeScalars.append("\\")
            default: break
            }
            out.unicodeScalars.append(u)
        }
    }
}

/// A canonical text for a number by its exact value: `i<integer>` when the
/// value is an integer (1.0, 1e2), else `d<digits>e<exponent>` with no
/// leading or trailing zeros (1.50e1 and 15.0 give one text).
enum Decimal10Key {
    static func text(_ lexeme: String) -> String {
        var neg = false, mantissa: [UInt8] = [], shift = 0, exp = 0, seenPoint = false, inExp = false, expNeg = false
        for u in lexeme.utf8 {
            switch u {
            case UInt8(ascii: "-"): if inExp { expNeg = true } else { neg = true }
            case UInt8(ascii: "+"): break
            case UInt8(ascii: "."): seenPoint = true
            case UInt8(ascii: "e"), UInt8(ascii: "E"): inExp = true
            default:
                let d = u &- UInt8(ascii: "0")
                if inExp { if exp < 1_000_000_000 { exp = exp * 10 + Int(d) } } else {
                    mantissa.append(d)
                    if seenPoint { shift += 1 }
                }
            }
        }
        if expNeg { exp = -exp }
        var start = 0
        while start < mantissa.count && mantissa[start] == 0 { start += 1 }
        var end = mantissa.count, trailing = 0
        while end > start && mantissa[end - 1] == 0 { end -= 1; trailing += 1 }
        if start == end { return "i0" }
        let digits = String(decoding: mantissa[start..<end].map { $0 + UInt8(ascii: "0") }, as: UTF8.self)
        let e = exp - shift + trailing
        if e >= 0 && e < 40 { return "i" + (neg ? "-" : "") + digits + String(repeating: "0", count: e) }
        return "d" + (neg ? "-" : "") + digits + "e" + String(e)
    }
}
