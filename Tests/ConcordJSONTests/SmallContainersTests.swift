import Testing

@testable import ConcordJSON

/// The tree parser's table of small nested containers (`SmallContainers`):
/// a value sent again is handed back as the tree kept from before, and the
/// parse answers exactly as it would without the table — the same values,
/// the same errors at the same bytes, the same verbatim ranges.
struct SmallContainersTests {
    let parser = JSONParser()

    private func member(_ v: JSON, _ path: String...) -> JSON? {
        var v: JSON? = v
        for name in path { v = v?[name] }
        return v
    }

    @Test func aRepeatedNestedValueIsHandedBackAsTheSameTree() throws {
        // The thread's table may be backing off after another test's run of
        // distinct values (it then looks up one container in 32). A line
        // parsed 100 times is looked up at least twice: the second finds
        // the first, and the table looks up every container again.
        // Here it is made to back off first, whatever ran before.
        let distinct = #"{"op":"update","model":{"items":["# + (0..<100).map { #"{"id":"D:\#($0)"}"# }.joined(separator: ",") + "]}}"
        _ = try parser.parse(distinct)
        let warm = Array(#"{"op":"update","model":{"id":"W","w":{"id":"Warm:1","n":1}}}"#.utf8)
        for _ in 0..<100 { _ = try parser.parse(warm) }
        let a = try parser.parse(#"{"op":"update","model":{"id":"Post:1","n":1,"author":{"id":"Person:1","name":"Ann"},"tags":["a","b","c"]}}"#)
        let b = try parser.parse(#"{"op":"update","model":{"id":"Post:1","n":2,"author":{"id":"Person:1","name":"Ann"},"tags":["a","b","c"]}}"#)
        guard case .object(let a1)? = member(a, "model", "author"), case .object(let b1)? = member(b, "model", "author"),
              case .array(let a2)? = member(a, "model", "tags"), case .array(let b2)? = member(b, "model", "tags") else {
            Issue.record("unexpected shape")
            return
        }
        #expect(sameBuffer(a1.members, b1.members))
        #expect(sameBuffer(a2, b2))
        // A model itself (depth 2) is never taken from the table: the
        // engine splices a model's bytes by the identity of its members.
        let c = try parser.parse(#"{"op":"update","model":{"id":"Person:1","name":"Ann","x":1}}"#)
        let d = try parser.parse(#"{"op":"update","model":{"id":"Person:1","name":"Ann","x":1}}"#)
        guard case .object(let cm)? = member(c, "model"), case .object(let dm)? = member(d, "model") else {
            Issue.record("unexpected shape")
            return
        }
        #expect(!sameBuffer(cm.members, dm.members))
        #expect(cm == dm)
        // Different bytes, even for an equal value, are a different entry.
        let e = try parser.parse(#"{"op":"update","model":{"id":"Post:1","author":{"name":"Ann","id":"Person:1"}}}"#)
        guard case .object(let e1)? = member(e, "model", "author") else {
            Issue.record("unexpected shape")
            return
        }
        #expect(!sameBuffer(e1.members, a1.members))
        #expect(e1 == a1)
    }

    /// Kept at a depth that fits, the same bytes deeper than the limit
    /// allows still fail as the parse fails (the tape has no table).
    @Test func aKeptValueNeverNestsPastTheLimit() {
        let inner = #"{"c":[1,2,3,4,5]}"#  // two levels
        let fits = Array((#"{"a":{"b":"# + inner + "}}").utf8)  // inner at depth 3: 3 + 2 - 1 = 4
        let deeper = Array((#"{"x":{"a":{"b":"# + inner + "}}}").utf8)  // at depth 4: 5 levels
        let parser = JSONParser(maxDepth: 4)
        #expect((try? parser.parse(fits)) != nil)
        #expect((try? parser.parse(fits)) != nil)  // a hit
        #expect(throws: JSONParseError.self) { try parser.parse(deeper) }
        JSONTapeTests.agree(fits, maxDepth: 4)
        JSONTapeTests.agree(deeper, maxDepth: 4)
        // At a depth that fits exactly, after the deeper one refused.
        JSONTapeTests.agree(Array((#"[0,{"b":"# + inner + "}]").utf8), maxDepth: 4)
    }

    /// A hit counts the irregularities its parse counted: whitespace inside
    /// a kept value keeps a model that holds it from being spliced verbatim.
    @Test func aHitCountsWhatItsParseCounted() throws {
        let irregular = Array(#"{"op":"update","model":{"id":"a","x":{"y": 1,"z":2}}}"#.utf8)
        for _ in 0..<3 {
            let (_, range) = try parser.parse(irregular, verbatimMember: "model")
            #expect(range == nil)
        }
        let regular = Array(#"{"op":"update","model":{"id":"a","x":{"y":1,"z":2}}}"#.utf8)
        for _ in 0..<3 {
            let (v, range) = try parser.parse(regular, verbatimMember: "model")
            #expect(range.map { Array(regular[$0]) } == Array(v["model"]!.compactString.utf8))
        }
    }

    /// Bytes that only look like a kept value — cut short, closed by the
    /// wrong bracket, an escape that swallows a quote — fail as they would.
    @Test func bytesThatAreNotAKeptValueFailAsTheyWould() {
        let kept = #"{"y":1,"z":"abc"}"#
        JSONTapeTests.agree(Array((#"{"a":{"b":"# + kept + "}}").utf8))
        for text in [
            #"{"a":{"b":"# + kept,
            #"{"a":{"b":"# + kept + "]}",
            #"{"a":{"b":{"y":1,"z":"abc\"}}}"#,
            #"{"a":{"b":{"y":1,"z":"ab"#,
            #"{"a":{"b":["abc\\"]}}"#,
            #"{"a":{"b":["abc\\"]}"#,
        ] {
            JSONTapeTests.agree(Array(text.utf8))
        }
    }

    /// Random lines built from a small pool of nested values (so most
    /// nested values are hits), and random byte edits of them: the tree
    /// parser agrees with the tape (no table) on every one.
    @Test func agreesWithTheTapeOnRepeatedValuesAndEdits() {
        var rng = Xorshift(seed: 0xC0_47A1_4E25)
        let pool = (0..<12).map { _ in JSONTapeTests.randomValue(&rng, depth: 2).compactString }
        for i in 0..<1_500 {
            var text = #"{"op":"update","model":{"id":"x","#
            for j in 0..<Int(rng.next() % 4) {
                text += #""m\#(j)":"# + pool[Int(rng.next() % UInt64(pool.count))] + ","
            }
            text += #""deep":[[{"v":"# + pool[Int(rng.next() % UInt64(pool.count))] + "}]]}}"
            var bytes = Array(text.utf8)
            if i % 3 == 0 {
                let at = Int(rng.next() % UInt64(bytes.count))
                let edits = Array(#"{}[]",:\ 1a"#.utf8)
                bytes[at] = edits[Int(rng.next() % UInt64(edits.count))]
            }
            JSONTapeTests.agree(bytes, maxDepth: 6 + Int(rng.next() % 6))
        }
    }

    /// After 64 misses in a row the table looks up one container in 32
    /// (a line of distinct values pays little for it); a hit restores
    /// looking up every one.
    @Test func aRunOfMissesLooksUpOneInThirtyTwoUntilAHit() {
        let table = SmallContainers.make()
        defer { table.free() }
        let bytes = Array(#"{"id":"Person:1","name":"Ann"}"#.utf8)
        var probe = SmallContainers.Probe()
        bytes.withUnsafeBufferPointer { b in
            #expect(table.find(b.baseAddress!, count: b.count, &probe) == nil)
            table.keep(.string("kept"), b.baseAddress!, probe, irregular: 0)
        }
        for _ in 0..<63 { table.missed() }  // 64 in a row with the lookup above
        var looked = 0
        for _ in 0..<320 where table.shouldLook() { looked += 1 }
        #expect(looked == 10)
        bytes.withUnsafeBufferPointer { b in
            #expect(table.find(b.baseAddress!, count: b.count, &probe)?.0 == .string("kept"))
        }
        #expect((0..<10).allSatisfy { _ in table.shouldLook() })
    }
}
