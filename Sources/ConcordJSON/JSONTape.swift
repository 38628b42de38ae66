/// A line of JSON parsed once into a flat array of nodes over the line's own
/// bytes (issue 19, "a flat parse"): no tree, no `String` for keys or values,
/// no allocation per node, and the array is reused from one line to the
/// next. It accepts exactly what ``JSONParser`` accepts and refuses the rest
/// with the same error at the same byte (it shares its scanning); ``json(_:)``
/// builds the same tree ``JSONParser`` would, for callers that need one.
///
/// Layout: a value is one node; an array's elements follow it; an object's
/// members follow it as key, value, key, value. `next` is the index after a
/// node's whole subtree, so a reader skips a member in O(1); `count` is an
/// array's elements or an object's members (duplicates included: a lookup
/// returns the last one, as the tree keeps the last value).
///
/// The bytes are not copied: node ranges index the buffer given to
/// ``parse(_:)``, which the caller keeps alive while reading the tape.
public struct JSONTape {
    public enum Kind: UInt8, Sendable {
        case null, `false`, `true`, number, string
        /// A string with escapes: decode it to read it (``string(_:in:)``).
        case escapedString
        case array, object
    }

    public struct Node: Sendable, Equatable {
        public var kind: Kind
        /// The value's bytes; for strings, the content between the quotes.
        public var start: UInt32
        public var end: UInt32
        /// The index after this node's subtree.
        public var next: UInt32
        /// Elements (arrays) or members (objects); 0 otherwise.
        public var count: UInt32
    }

    /// Maximum nesting, as ``JSONParser/maxDepth``.
    public var maxDepth: Int
    public private(set) var nodes: [Node] = []

    public init(maxDepth: Int = 128) {
        self.maxDepth = maxDepth
    }

    /// Parses `buf` (one JSON value, whitespace around it allowed); the
    /// root is node 0. The previous line's nodes are dropped, their storage kept.
    public mutating func parse(_ buf: UnsafeBufferPointer<UInt8>) throws(JSONParseError) {
        nodes.removeAll(keepingCapacity: true)
        guard buf.count < Int(UInt32.max) else {
            throw JSONParseError(kind: .syntax, offset: 0, reason: "a line of 4 GiB or more")
        }
        var state = ParserState(buf: buf, maxDepth: maxDepth)
        state.skipWhitespace()
        try value(&state, depth: 0)
        state.skipWhitespace()
        if state.pos != buf.count {
            throw state.error("unexpected content after the JSON value")
        }
    }

    private mutating func leaf(_ kind: Kind, _ start: Int, _ end: Int) {
        nodes.append(Node(kind: kind, start: UInt32(start), end: UInt32(end), next: UInt32(nodes.count + 1), count: 0))
    }

    private mutating func value(_ s: inout ParserState, depth: Int) throws(JSONParseError) {
        guard s.pos < s.buf.count else { throw s.error("unexpected end of input") }
        let at = s.pos
        switch s.buf[s.pos] {
        case UInt8(ascii: "{"):
            try container(.object, &s, depth: depth + 1)
        case UInt8(ascii: "["):
            try container(.array, &s, depth: depth + 1)
        case UInt8(ascii: "\""):
            let r = try s.scanString()
            leaf(r.escaped ? .escapedString : .string, r.start, r.end)
        case UInt8(ascii: "t"):
            try s.expectLiteral("true")
            leaf(.true, at, s.pos)
        case UInt8(ascii: "f"):
            try s.expectLiteral("false")
            leaf(.false, at, s.pos)
        case UInt8(ascii: "n"):
            try s.expectLiteral("null")
            leaf(.null, at, s.pos)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            let start = try s.scanNumber()
            leaf(.number, start, s.pos)
        case 0xEF:
            throw s.error("a byte order mark is not allowed")
        default:
            throw s.error("unexpected character")
        }
    }

    /// An object or an array, its members or elements after it.
    private mutating func container(_ kind: Kind, _ s: inout ParserState, depth: Int) throws(JSONParseError) {
        let isObject = kind == .object
        let closer = isObject ? UInt8(ascii: "}") : UInt8(ascii: "]")
        let (me, empty) = try open(kind, &s, depth: depth, closer: closer)
        var count: UInt32 = 0
        if !empty {
            repeat {
                s.skipWhitespace()
                if isObject { try memberName(&s) }
                try value(&s, depth: depth)
                count += 1
            } while try Self.more(&s, closer: closer, in: isObject ? "an object" : "an array")
        }
        close(me, at: s.pos, count: count)
    }

    /// `"name" :` — the key's node, and the scanner at the value.
    private mutating func memberName(_ s: inout ParserState) throws(JSONParseError) {
        guard s.pos < s.buf.count, s.buf[s.pos] == UInt8(ascii: "\"") else {
            throw s.error("expected a member name in double quotes")
        }
        let k = try s.scanString()
        leaf(k.escaped ? .escapedString : .string, k.start, k.end)
        s.skipWhitespace()
        guard s.pos < s.buf.count, s.buf[s.pos] == UInt8(ascii: ":") else { throw s.error("expected ':' after a member name") }
        s.pos += 1
        s.skipWhitespace()
    }

    /// After a member or an element: true at ',' (another follows), false at
    /// the closer; the tree parser's errors otherwise.
    private static func more(_ s: inout ParserState, closer: UInt8, in what: String) throws(JSONParseError) -> Bool {
        s.skipWhitespace()
        guard s.pos < s.buf.count else { throw s.error("unexpected end of input in \(what)") }
        let c = s.buf[s.pos]
        s.pos += 1
        if c == UInt8(ascii: ",") { return true }
        if c == closer { return false }
        s.pos -= 1
        throw s.error("expected ',' or '\(Character(UnicodeScalar(closer)))' in \(what)")
    }

    /// A container's node, opened at its bracket; `empty` when its closer
    /// follows at once (then consumed).
    private mutating func open(_ kind: Kind, _ s: inout ParserState, depth: Int, closer: UInt8) throws(JSONParseError) -> (node: Int, empty: Bool) {
        if depth > maxDepth { throw s.error("nesting deeper than \(maxDepth) levels", kind: .tooDeep) }
        let node = nodes.count
        nodes.append(Node(kind: kind, start: UInt32(s.pos), end: 0, next: 0, count: 0))
        s.pos += 1
        s.skipWhitespace()
        guard s.pos < s.buf.count, s.buf[s.pos] == closer else { return (node, false) }
        s.pos += 1
        return (node, true)
    }

    private mutating func close(_ node: Int, at end: Int, count: UInt32) {
        nodes[node].end = UInt32(end)
        nodes[node].next = UInt32(nodes.count)
        nodes[node].count = count
    }

    // MARK: Reading

    /// The value of member `name` of the object at `object` (the last one
    /// when the name repeats), by comparing bytes; nil when absent or when
    /// `object` is not an object.
    public func member(_ name: String, of object: Int, in buf: UnsafeBufferPointer<UInt8>) -> Int? {
        guard nodes[object].kind == .object else { return nil }
        var name = name
        return name.withUTF8 { want -> Int? in
            var found: Int?
            var i = object + 1
            for _ in 0..<nodes[object].count {
                let key = nodes[i]
                if keyEquals(key, want, buf) { found = i + 1 }
                i = Int(nodes[i + 1].next)
            }
            return found
        }
    }

    private func keyEquals(_ key: Node, _ want: UnsafeBufferPointer<UInt8>, _ buf: UnsafeBufferPointer<UInt8>) -> Bool {
        if key.kind == .escapedString {
            var decoded = string(key, in: buf)
            return decoded.withUTF8 { $0.elementsEqual(want) }
        }
        let n = Int(key.end - key.start)
        guard n == want.count else { return false }
        return UnsafeBufferPointer(rebasing: buf[Int(key.start)..<Int(key.end)]).elementsEqual(want)
    }

    /// The elements of an array, or the values of an object's members in order (indexes).
    public func children(of node: Int) -> [Int] {
        var out: [Int] = []
        var i = node + 1
        let isObject = nodes[node].kind == .object
        for _ in 0..<nodes[node].count {
            if isObject { i += 1 }
            out.append(i)
            i = Int(nodes[i].next)
        }
        return out
    }

    /// A string node's text (decoded when it has escapes).
    public func string(_ node: Node, in buf: UnsafeBufferPointer<UInt8>) -> String {
        let content = UnsafeBufferPointer(rebasing: buf[Int(node.start)..<Int(node.end)])
        guard node.kind == .escapedString else { return String(decoding: content, as: UTF8.self) }
        // Validated when parsed: decoding it again cannot fail.
        var s = ParserState(buf: buf, maxDepth: maxDepth)
        s.pos = Int(node.start) - 1
        return (try? s.parseString()) ?? ""
    }

    /// The tree ``JSONParser`` builds for the value at `node` (duplicate
    /// member names: the first one's place, the last one's value).
    public func json(_ node: Int = 0, in buf: UnsafeBufferPointer<UInt8>) -> JSON {
        let n = nodes[node]
        switch n.kind {
        case .null: return .null
        case .false: return .bool(false)
        case .true: return .bool(true)
        case .number:
            return .number(JSONNumber(unchecked: String(decoding: UnsafeBufferPointer(rebasing: buf[Int(n.start)..<Int(n.end)]), as: UTF8.self)))
        case .string, .escapedString: return .string(string(n, in: buf))
        case .array:
            return .array(children(of: node).map { json($0, in: buf) })
        case .object:
            var members: [JSONObject.Member] = []
            members.reserveCapacity(Int(n.count))
            var index: [String: Int] = [:]
            var i = node + 1
            for _ in 0..<n.count {
                let key = string(nodes[i], in: buf)
                let value = json(i + 1, in: buf)
                if let at = index[key] {
                    members[at].value = value
                } else {
                    index[key] = members.count
                    members.append(JSONObject.Member(key: key, value: value))
                }
                i = Int(nodes[i + 1].next)
            }
            return .object(JSONObject(members))
        }
    }
}
