import Testing

@testable import ConcordJSON

/// The tape accepts exactly what the tree parser accepts, refuses the rest
/// with the same error at the same byte, and reads back the same values.
struct JSONTapeTests {
    /// Parses `bytes` both ways; records any difference.
    static func agree(_ bytes: [UInt8], maxDepth: Int = 128, sourceLocation: SourceLocation = #_sourceLocation) {
        let parser = JSONParser(maxDepth: maxDepth)
        var tape = JSONTape(maxDepth: maxDepth)
        bytes.withUnsafeBufferPointer { buf in
            let tree: Result<JSON, JSONParseError> = Result { () throws(JSONParseError) -> JSON in try parser.parse(buf) }
            let flat: Result<JSON, JSONParseError> = Result { () throws(JSONParseError) -> JSON in
                try tape.parse(buf)
                return tape.json(0, in: buf)
            }
            switch (tree, flat) {
            case (.success(let a), .success(let b)):
                #expect(a.encoded() == b.encoded(), "\(String(decoding: bytes, as: UTF8.self))", sourceLocation: sourceLocation)
                #expect(Int(tape.nodes[0].next) == tape.nodes.count, sourceLocation: sourceLocation)
            case (.failure(let a), .failure(let b)):
                #expect(a.kind == b.kind && a.offset == b.offset && a.reason == b.reason,
                        "\(String(decoding: bytes, as: UTF8.self)): \(a) / \(b)", sourceLocation: sourceLocation)
            default:
                Issue.record("one accepts, the other refuses: \(String(decoding: bytes, as: UTF8.self)): \(tree) / \(flat)",
                             sourceLocation: sourceLocation)
            }
        }
    }

    @Test(arguments: [
        "{}", "[]", "0", "-0", "1.5e10", "-1E-2", "\"a\"", "true", "false", "null", " 7 ",
        #"{"a":[1,{"b":null}],"c":"\u00e9\ud83d\ude00\n\t\"\\\/"}"#, " \t\r\n[ 1 , 2 ]\n ",
        #"{"a":1,"a":2,"b":{"a":[],"a":{}}}"#, #"{"\u0061":1,"a":2}"#, #"["é","日本",{"ключ":"значение"}]"#,
        "", "{", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "1e", "+1", "NaN", "Infinity", "-Infinity",
        "tru", "nul", "'a'", "{a:1}", "\"\u{01}\"", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"",
        "[1] [2]", "\u{FEFF}{}", "{\"a\" 1}", "\"abc", "[1 2]", "{\"a\":1 \"b\":2}", "-", "[", "{\"a\":",
    ])
    func agreesWithTheTreeParser(text: String) {
        Self.agree(Array(text.utf8))
    }

    @Test func agreesOnInvalidUTF8AndDepth() {
        for bytes: [UInt8] in [[0x22, 0xC3, 0x28, 0x22], [0x22, 0xFF, 0x22], [0x22, 0xED, 0xA0, 0x80, 0x22], [0x22, 0xE2, 0x82, 0x22],
                               [0x7B, 0x22, 0xFF, 0x22, 0x3A, 0x31, 0x7D]] {
            Self.agree(bytes)
        }
        for depth in 1...5 {
            Self.agree(Array(String(repeating: "[", count: depth) + String(repeating: "]", count: depth)).map { $0.asciiValue! }, maxDepth: 3)
            Self.agree(Array((String(repeating: "{\"a\":", count: depth) + "1" + String(repeating: "}", count: depth)).utf8), maxDepth: 3)
        }
    }

    /// Random values, and random byte edits of their encodings (mostly invalid).
    @Test func agreesOnRandomValuesAndEdits() {
        var rng = Xorshift(seed: 0x5EED_7A9E)
        for _ in 0..<400 {
            let bytes = Self.randomValue(&rng, depth: 0).encoded()
            Self.agree(bytes)
            for _ in 0..<4 {
                var edited = bytes
                let i = Int(rng.next() % UInt64(edited.count))
                switch rng.next() % 3 {
                case 0:
                    let structural = Array("{}[]\",:\\ 0e.-tfnu\u{7f}".utf8)
                    edited[i] = structural[Int(rng.next() % UInt64(structural.count))]
                case 1: edited.remove(at: i)
                default: edited.insert(UInt8(truncatingIfNeeded: rng.next()), at: i)
                }
                Self.agree(edited)
            }
        }
    }

    @Test func membersAreFoundByBytesAndTheLastDuplicateWins() throws {
        let text = Array(#"{"id":"A:1","n":1,"nested":{"id":"B","x":[1,2,{"y":3}]},"n":2,"k\u00e9y":"v","":0}"#.utf8)
        var tape = JSONTape()
        try text.withUnsafeBufferPointer { buf in
            try tape.parse(buf)
            #expect(tape.nodes[0].kind == .object && tape.nodes[0].count == 6)
            let n = try #require(tape.member("n", of: 0, in: buf))
            #expect(tape.json(n, in: buf) == 2)
            let nested = try #require(tape.member("nested", of: 0, in: buf))
            #expect(tape.string(tape.nodes[try #require(tape.member("id", of: nested, in: buf))], in: buf) == "B")
            let x = try #require(tape.member("x", of: nested, in: buf))
            #expect(tape.children(of: x).map { tape.json($0, in: buf) } == [1, 2, ["y": 3]])
            #expect(tape.json(try #require(tape.member("kéy", of: 0, in: buf)), in: buf) == "v")
            #expect(tape.json(try #require(tape.member("", of: 0, in: buf)), in: buf) == 0)
            #expect(tape.member("missing", of: 0, in: buf) == nil)
            #expect(tape.member("id", of: n, in: buf) == nil)  // not an object
            // Skipping a subtree is one step: the member after "nested" is the second "n".
            #expect(Int(tape.nodes[nested].next) + 1 == n)
        }
        // The node array is reused: the next line replaces it.
        let capacity = tape.nodes.capacity
        try Array("[true]".utf8).withUnsafeBufferPointer { buf in try tape.parse(buf) }
        #expect(tape.nodes.count == 2 && tape.nodes.capacity == capacity)
    }

    static func randomValue(_ rng: inout Xorshift, depth: Int) -> JSON {
        let strings = ["", "a", "id", "é", "日本語", "quote\"back\\slash", "tab\there", "\u{1}ctl", "😀", "Person:1"]
        switch rng.next() % (depth > 4 ? 5 : 7) {
        case 0: return .null
        case 1: return .bool(rng.next() % 2 == 0)
        case 2: return .number(JSONNumber(unchecked: ["0", "-1", "3.25", "1e9", "-0.5E-3", "123456789012345678901234567890"][Int(rng.next() % 6)]))
        case 3, 4: return .string(strings[Int(rng.next() % UInt64(strings.count))])
        case 5: return .array((0..<Int(rng.next() % 4)).map { _ in randomValue(&rng, depth: depth + 1) })
        default:
            var o = JSONObject()
            for _ in 0..<Int(rng.next() % 5) { o[strings[Int(rng.next() % UInt64(strings.count))]] = randomValue(&rng, depth: depth + 1) }
            return .object(o)
        }
    }
}

/// A small deterministic generator (the same cases on every run).
struct Xorshift {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return state
    }
}
