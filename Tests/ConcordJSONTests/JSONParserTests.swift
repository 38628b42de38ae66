import Testing

@testable import ConcordJSON

struct JSONParserTests {
    let parser = JSONParser()

    @Test(arguments: [
        "{}", "[]", "0", "-0", "1.5e10", "-1E-2", "\"a\"", "true", "false", "null",
        #"{"a":[1,{"b":null}],"c":"\u00e9\ud83d\ude00\n\t\"\\\/"}"#, " \t\r\n[ 1 , 2 ]\n ",
    ])
    func acceptsValidJSON(text: String) throws {
        let v = try parser.parse(text)
        // Round trip: encoding and re-parsing gives an equal value.
        #expect(try parser.parse(v.compactString) == v)
    }

    @Test(arguments: [
        "", "{", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "1e", "+1", "NaN", "Infinity", "-Infinity",
        "tru", "nul", "'a'", "{a:1}", "\"\u{01}\"", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"",
        "[1] [2]", "\u{FEFF}{}", "{\"a\" 1}", "\"abc",
    ])
    func rejectsInvalidJSON(text: String) {
        #expect(throws: JSONParseError.self) { try parser.parse(text) }
    }

    /// For each length: `each` random texts, one of "x" only, and the same
    /// with its last byte changed.
    static func texts(lengths: ClosedRange<Int>, each: Int, _ rng: inout SystemRandomNumberGenerator) -> [String] {
        let alphabet = Array("abcdefghij0123456789 _:-".utf8)
        var texts: [String] = []
        for n in lengths {
            for _ in 0..<each {
                texts.append(String(decoding: (0..<n).map { _ in alphabet.randomElement(using: &rng)! }, as: UTF8.self))
            }
            let stem = String(repeating: "x", count: n)
            texts.append(stem)
            if n > 0 { texts.append(String(stem.dropLast()) + "y") }
        }
        return texts
    }

    /// Short strings come from the thread's table: every length from 0 to
    /// 20, at every distance from the end of the line (the words are loaded
    /// whole only when 16 bytes are readable), names and values, texts that
    /// share a first word or differ only in their last byte, many more
    /// than the table has slots (hits, misses, slots taken over).
    @Test func shortStringsFromTheTableAreTheTextsParsed() throws {
        // On this platform they are made from their words, not the table.
        #expect(ShortStrings.smallLayout, "the runtime's small-string layout is not the one assumed: the table is used")
        var rng = SystemRandomNumberGenerator()
        let alphabet = Array("abcdefghij0123456789 _:-".utf8)
        var texts = Self.texts(lengths: 0...20, each: 12, &rng)
        // Many texts alike in one word and length, so that some share a slot.
        for n in 9...15 {
            for _ in 0..<300 {
                let tail = String(decoding: (8..<n).map { _ in alphabet.randomElement(using: &rng)! }, as: UTF8.self)
                texts.append("same8byt" + tail)
                texts.append(tail + String(repeating: "w", count: 16 - n) + "sameend")
            }
        }
        for round in 0..<2 {
            for t in texts.shuffled(using: &rng) {
                // As a value at the end of the line, as a name, and as an array item.
                #expect(try parser.parse("\"\(t)\"") == .string(t), "round \(round): \(t)")
                let v = try parser.parse(#"{"\#(t)":"\#(t)","n":[\#(t.count),"\#(t)"]}"#)
                guard case .object(let o) = v, o.members.count == 2 else {
                    Issue.record("not an object of two members: \(v)")
                    continue
                }
                #expect(o.members[0].key == t && o.members[0].value == .string(t))
                #expect(o.members[1].value == .array([.number(JSONNumber(t.count)), .string(t)]))
            }
        }
    }

    /// Strings of 16 to 128 bytes come from the thread's table of longer
    /// strings: the same text parsed again is the same string (one storage,
    /// no allocation), and every text is the one parsed — every length from
    /// 15 to 130 (both ends of the table's range), texts that differ only in
    /// their last byte or in one word of the middle, many more than the
    /// table has slots (hits, misses, slots taken over), and texts with an
    /// escape or past 128 bytes (never from the table).
    @Test func longStringsFromTheTableAreTheTextsParsed() throws {
        func storage(_ s: String) -> UInt64 { unsafeBitCast(s, to: (UInt64, UInt64).self).1 }
        func parsedValue(_ t: String) throws -> String {
            guard case .object(let o) = try parser.parse(#"{"v":"\#(t)"}"#), case .string(let s) = o.members[0].value else {
                Issue.record("not an object with a string")
                return ""
            }
            return s
        }
        let repeated = "A document of about two hundred bytes"
        let a = try parsedValue(repeated), b = try parsedValue(repeated)
        #expect(a == repeated && b == repeated)
        #expect(storage(a) == storage(b), "a repeated long string is handed back from the table")
        let escaped = #"A document\u0020of about two hundred bytes"#
        #expect(try parsedValue(escaped) == repeated)
        let long = String(repeating: "z", count: 129)
        let c = try parsedValue(long), d = try parsedValue(long)
        #expect(c == long && d == long && storage(c) != storage(d), "past 128 bytes each parse makes its own string")

        var rng = SystemRandomNumberGenerator()
        var texts = Self.texts(lengths: 15...130, each: 6, &rng)
        for n in 24...130 {
            let stem = String(repeating: "x", count: n)
            texts.append(String(stem.prefix(8)) + "yyyyyyyy" + String(stem.dropFirst(16)))
        }
        // Other UTF-8 (8 bytes and up go through the table too): two- to
        // four-byte characters, the same text again is the same string.
        let wide = Array("éü中文😀ab".unicodeScalars)
        for n in 2...60 {
            texts.append(String(String.UnicodeScalarView((0..<n).map { _ in wide.randomElement(using: &rng)! })))
        }
        let accented = "Zoë Saldaña — café crème brûlée"
        let e = try parsedValue(accented), f = try parsedValue(accented)
        #expect(e == accented && storage(e) == storage(f))
        // Invalid UTF-8 is refused whether or not valid text of its length went before.
        for bad: [UInt8] in [[0xC3, 0x28], [0xE2, 0x82], [0xF0, 0x9F, 0x98], [0xED, 0xA0, 0x80], [0xC0, 0xAF]] {
            for pad in [6, 14, 40] {
                let line = Array("\"".utf8) + Array(repeating: UInt8(ascii: "a"), count: pad) + bad + Array("\"".utf8)
                let good = Array("\"".utf8) + Array(repeating: UInt8(ascii: "a"), count: pad) + Array("é".utf8) + Array("\"".utf8)
                #expect(throws: JSONParseError.self) { try parser.parse(line) }
                _ = try parser.parse(good)
                #expect(throws: JSONParseError.self) { try parser.parse(line) }
            }
        }
        for round in 0..<3 {
            for t in texts.shuffled(using: &rng) {
                #expect(try parsedValue(t) == t, "round \(round): \(t)")
                #expect(try parser.parse("[\"\(t)\",\"\(t)\"]") == .array([.string(t), .string(t)]), "round \(round): \(t)")
            }
        }
    }

    /// `sameText` decides small ASCII texts from their two words: it must
    /// agree with byte equality for strings made every way (literals, parsed, built
    /// from bytes, interpolated, sliced back), small and large, ASCII or
    /// not, equal or differing in one byte or in length.
    @Test func sameTextIsByteEquality() throws {
        var rng = SystemRandomNumberGenerator()
        let alphabet = Array("abz09_:é".unicodeScalars)
        var texts: [String] = ["", "op", "model", "token", "force", "key", "rid", "é", "e\u{301}"]
        for n in 0...20 {
            for _ in 0..<6 {
                texts.append(String(String.UnicodeScalarView((0..<n).map { _ in alphabet.randomElement(using: &rng)! })))
            }
            texts.append(String(repeating: "a", count: n))
            texts.append(String(repeating: "a", count: max(0, n - 1)) + "b")
        }
        func variants(_ t: String) throws -> [String] {
            var v = [t, String(decoding: Array(t.utf8), as: UTF8.self), "\(t)", String(t[...])]
            if case .string(let parsed) = try parser.parse("\"\(t)\"") { v.append(parsed) }
            var grown = t
            grown.reserveCapacity(64)  // a native string, even when short
            v.append(grown)
            return v
        }
        // Canonically equivalent, different code points: different values.
        #expect(JSON.string("\u{E9}") != JSON.string("e\u{301}"))
        for a in texts {
            for b in texts {
                for x in try variants(a) {
                    for y in try variants(b) where sameText(x, y) != Array(x.utf8).elementsEqual(y.utf8) {
                        Issue.record("sameText(\(x.debugDescription), \(y.debugDescription)) is \(sameText(x, y))")
                    }
                }
            }
        }
    }

    @Test func rejectsInvalidUTF8() {
        for bytes: [UInt8] in [[0x22, 0xC3, 0x28, 0x22], [0x22, 0xFF, 0x22], [0x22, 0xED, 0xA0, 0x80, 0x22], [0x22, 0xE2, 0x82, 0x22]] {
            #expect(throws: JSONParseError.self) { try parser.parse(bytes) }
        }
    }

    @Test func depthLimitCountsTheOutermostContainerAsOne() throws {
        let p = JSONParser(maxDepth: 3)
        _ = try p.parse("[[[1]]]")
        #expect(throws: JSONParseError.self) { try p.parse("[[[[1]]]]") }
        do {
            _ = try p.parse("{\"a\":{\"b\":[[]]}}")
            Issue.record("expected too deep")
        } catch {
            #expect(error.kind == .tooDeep)
        }
    }

    @Test func duplicatedMembersKeepTheLastValueAtTheFirstPosition() throws {
        let v = try parser.parse(#"{"a":1,"b":2,"a":3}"#)
        #expect(v.compactString == #"{"a":3,"b":2}"#)
        var many = "{"
        for i in 0..<40 { many += "\"k\(i)\":\(i)," }
        many += "\"k0\":\"last\"}"
        let w = try parser.parse(many)
        #expect(w["k0"] == "last")
        #expect(w.objectValue?.count == 40)
    }

    /// The Double of a number: small integers read from their bytes, the
    /// rest through the C library — the same value as `Double(text)` always.
    @Test func doubleValueIsTheNearestDouble() {
        for t in ["0", "-0", "7", "-42", "123456789012345", "-123456789012345", "1234567890123456",
                  "99999999999999999999", "1.5", "-2.25e3", "1E2", "0.1", "1e400", "-1e-400"] {
            #expect(JSONNumber(unchecked: t).doubleValue == Double(t)!, "\(t)")
        }
    }

    @Test func numbersCompareByValue() throws {
        #expect(try parser.parse("1") == parser.parse("1.0"))
        #expect(try parser.parse("1") == parser.parse("10e-1"))
        #expect(try parser.parse("-0") == parser.parse("0"))
        #expect(try parser.parse("0.1") != parser.parse("0.10000000000000001"))
        #expect(try parser.parse("123456789012345678901234567890") != parser.parse("123456789012345678901234567891"))
        #expect(try parser.parse("1e400") != parser.parse("2e400"))
    }

    @Test func objectsCompareWithoutMemberOrder() throws {
        #expect(try parser.parse(#"{"a":1,"b":[1,2]}"#) == parser.parse(#"{"b":[1,2.0],"a":1}"#))
        #expect(try parser.parse(#"{"a":1}"#) != parser.parse(#"{"a":1,"b":null}"#))
        #expect(try parser.parse("[1,2]") != parser.parse("[2,1]"))
    }

    @Test func identities() throws {
        #expect(try parser.parse(#"{"id":12}"#).identity(idKey: "id") == "12")
        #expect(try parser.parse(#"{"id":"12"}"#).identity(idKey: "id") == "12")
        #expect(try parser.parse(#"{"id":-0}"#).identity(idKey: "id") == "0")
        for bad in [#"{"id":1.5}"#, #"{"id":1e2}"#, #"{"id":""}"#, #"{"id":null}"#, #"{"id":{}}"#, #"{"id":true}"#, #"{"x":1}"#] {
            #expect(try parser.parse(bad).identity(idKey: "id") == nil, "\(bad)")
        }
        #expect(try parser.parse(#"{"key":"A"}"#).identity(idKey: "key") == "A")
    }

    @Test func writerEscapesWhatRFC8259Requires() {
        let v = JSON.string("q\"b\\n\n\u{01}é")
        #expect(v.compactString == #""q\"b\\n\n\u0001é""#)
        var w = JSONWriter()
        for i in [0, 7, 10, -1, 1234567, Int.min, Int.max] { w.int(i); w.raw(",") }
        #expect(String(decoding: w.bytes, as: UTF8.self) == "0,7,10,-1,1234567,-9223372036854775808,9223372036854775807,")
    }

    /// The writer and the parser read strings eight bytes at a time
    /// (`ByteScan`): a byte needing attention is found at every offset in and
    /// across words, and next to others, exactly as a byte-by-byte reference does.
    @Test func stringsAreScannedCorrectlyAtEveryOffset() throws {
        func reference(_ s: String) -> String {
            var out = "\""
            for u in s.unicodeScalars {
                switch u {
                case "\"": out += "\\\""
                case "\\": out += "\\\\"
                case "\n": out += "\\n"
                case "\r": out += "\\r"
                case "\t": out += "\\t"
                case "\u{08}": out += "\\b"
                case "\u{0C}": out += "\\f"
                case _ where u.value < 0x20:
                    let hex = Array("0123456789abcdef")
                    out += "\\u00" + String(hex[Int(u.value >> 4)]) + String(hex[Int(u.value & 0xF)])
                default: out.unicodeScalars.append(u)
                }
            }
            return out + "\""
        }
        let specials: [String] = ["\"", "\\", "\n", "\u{01}", "\u{1F}", "\u{7F}", " ", "~", "é", "😀", "\"\"", "\\\u{1F}"]
        for before in 0..<19 {
            for after in [0, 1, 7, 8, 9, 16] {
                for sp in specials {
                    let s = String(repeating: "a", count: before) + sp + String(repeating: "b", count: after)
                    let written = JSON.string(s).compactString
                    #expect(written == reference(s), "\(before) \(sp.debugDescription) \(after)")
                    #expect(try parser.parse(written) == .string(s))
                    var tape = JSONTape()
                    let bytes = Array(written.utf8)
                    try bytes.withUnsafeBufferPointer { try tape.parse($0) }
                    #expect(tape.nodes.count == 1)
                }
                // A raw control character is refused at its own offset.
                let bad = Array(("\"" + String(repeating: "a", count: before) + "\u{01}" + String(repeating: "b", count: after) + "\"").utf8)
                do {
                    _ = try parser.parse(bad)
                    Issue.record("a raw control character was accepted")
                } catch {
                    #expect(error.offset == before + 1)
                }
                // An unterminated string is refused.
                let open = Array(("\"" + String(repeating: "a", count: before + after)).utf8)
                #expect(throws: JSONParseError.self) { try parser.parse(open) }
            }
        }
    }

    /// `parse(_:verbatimMember:)` reports the member's bytes exactly when
    /// they are the writer's encoding of the value parsed from them.
    @Test func aVerbatimMemberIsExactlyTheWritersEncoding() throws {
        var rng = Xorshift(seed: 7)
        var spliced = 0
        for _ in 0..<2000 {
            let v = JSONTapeTests.randomValue(&rng, depth: 0)
            let text = v.compactString
            let line = Array((#"{"op":"update","model":"# + text + #","rid":1}"#).utf8)
            let (parsed, range) = try parser.parse(line, verbatimMember: "model")
            #expect(parsed["model"] == v)
            if let range {
                spliced += 1
                #expect(Array(line[range]) == Array(text.utf8))
                #expect(parsed["model"]!.compactString == text)
            } else {
                // Only escapes in strings make the writer's own text irregular.
                #expect(text.contains("\\"), "\(text)")
            }
        }
        #expect(spliced > 1000)
        // Whitespace, an escape, a repeated name inside: not verbatim; outside: no matter.
        for (line, verbatim) in [
            (#"{"model": {"a":1} , "op":"x"}"#, true),
            (#"{"model":{"a": 1}}"#, false),
            (#"{"model":{"a":"\u0041"}}"#, false),
            (#"{"model":{"a":1,"a":2}}"#, false),
            (#"{"x":{"model":{"a":1}}}"#, false),
            (#"{"model":{"a":1},"model":{"b":2}}"#, true),
            (#"{"model":[1,{"b":[]}]}"#, true),
        ] {
            let bytes = Array(line.utf8)
            let (parsed, range) = try parser.parse(bytes, verbatimMember: "model")
            #expect((range != nil) == verbatim, "\(line)")
            if let range { #expect(Array(bytes[range]) == Array(parsed["model"]!.compactString.utf8), "\(line)") }
        }
    }
}
