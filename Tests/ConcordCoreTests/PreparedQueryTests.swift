import ConcordJSON
import ConcordProtocol
import Testing

@testable import ConcordCore

/// Requests decoded off the sequencer (long lines, on the parse thread) with
/// their queries prepared there: the engine answers them as it answers the
/// same lines it decodes itself, and a dropped view's large definition is
/// handed over to be freed elsewhere.
@Suite struct PreparedQueryTests {
    @Test func bothKeysComeFromOneEncoding() {
        let specs: [QuerySpec] = [
            QuerySpec(type: "Post"),
            QuerySpec(type: "Post", offset: 20, limit: 10),
            QuerySpec(type: "Post", condition: .oneOf(["date"], [.int(3), .string("x"), .array([.int(1)])]),
                      order: [QueryOrderKey(path: ["date"], descending: true), QueryOrderKey(path: ["a", "b"])], limit: 5),
            QuerySpec(type: "T\u{e9}", condition: .all([.compare(["n"], .gte, .int(2)), .not(.exists(["x"], true))]), offset: 7),
        ]
        for spec in specs {
            var unwindowed = spec
            unwindowed.offset = 0
            unwindowed.limit = nil
            let keys = spec.canonicalKeys
            #expect(keys.windowed == spec.canonicalKey)
            #expect(keys.unwindowed == unwindowed.canonicalKey)
        }
    }

    /// The same session twice, decoded by the engine and decoded beforehand:
    /// the same responses and events, byte for byte.
    @Test func preparedRequestsAreAnsweredAsDecodedOnes() {
        func run(prepared: Bool) -> [String] {
            let h = EngineHarness()
            h.decodesOffTheSequencer = prepared
            let w = h.connect()
            let r = h.connect()
            for i in 0..<60 { w.ok(#"{"op":"update","model":{"id":"Post:\#(i)","date":\#(i),"tag":"\#(i % 3)"}}"#) }
            let many = (0..<5000).map { String($0 * 2) }.joined(separator: ",")
            var out: [String] = []
            let lines = [
                #"{"op":"get","rid":1,"query":{"type":"Post","where":{"path":"date","in":[\#(many)]},"order":[{"path":"date","desc":true}],"limit":4}}"#,
                #"{"op":"subscribe","sub":"big","query":{"type":"Post","where":{"path":"date","in":[\#(many)]},"order":[{"path":"date"}],"offset":2,"limit":3}}"#,
                #"{"op":"subscribe","sub":"page","query":{"type":"Post","where":{"path":"date","in":[\#(many)]},"order":[{"path":"date"}],"limit":3}}"#,
                #"{"op":"subscribe","sub":"tag","query":{"type":"Post","where":{"path":"tag","eq":"1"},"limit":5}}"#,
                #"{"op":"get","query":{"type":"Post","where":{"path":"date","lt":"x"}}}"#,
                #"{"op":"get","query":{"type":"Post","where":{"path":"date","in":3}}}"#,
                #"{"op":"subscribe","sub":"big","query":{"type":"Post"}}"#,
            ]
            for line in lines { out.append(r.send(line).compactString) }
            for i in [0, 1, 7, 200] { w.ok(#"{"op":"update","model":{"id":"Post:\#(i)","date":\#(i + 1),"tag":"1"}}"#) }
            w.ok(#"{"op":"delete","id":"Post:4"}"#)
            out.append(r.send(#"{"op":"unsubscribe","sub":"page"}"#).compactString)
            out.append(r.send(#"{"op":"unsubscribe","sub":"big"}"#).compactString)
            w.ok(#"{"op":"update","model":{"id":"Post:10","date":11}}"#)
            out += r.take().map(\.compactString)
            return out
        }
        let decoded = run(prepared: false)
        let prepared = run(prepared: true)
        #expect(decoded.count > 12)
        #expect(prepared == decoded)
    }

    @Test func aDroppedLargeDefinitionIsHandedOverToBeFreed() {
        let h = EngineHarness()
        h.engine.collectsGarbage = true
        h.decodesOffTheSequencer = true
        let c = h.connect()
        for i in 0..<10 { c.ok(#"{"op":"update","model":{"id":"Post:\#(i)","date":\#(i)}}"#) }
        let list = { (n: Int) in (0..<n).map(String.init).joined(separator: ",") }
        func drain() {
            while h.engine.hasDeferredWork { h.engine.doDeferredWork(units: 64) }
        }
        // Small definitions are freed where they are dropped.
        #expect(c.ok(#"{"op":"get","query":{"type":"Post","where":{"path":"date","in":[\#(list(100))]}}}"#)["count"] == 10)
        drain()
        #expect(h.engine.takeGarbage().isEmpty)
        // A large one, read once: its view is dropped after the answer.
        #expect(c.ok(#"{"op":"get","query":{"type":"Post","where":{"path":"date","in":[\#(list(PreparedQuery.large))]}}}"#)["count"] == 10)
        drain()
        #expect(h.engine.takeGarbage().count == 2)
        #expect(h.engine.takeGarbage().isEmpty)
        // Subscribed, the view stays until the last subscriber goes.
        c.ok(#"{"op":"subscribe","sub":"q","query":{"type":"Post","where":{"path":"date","in":[\#(list(PreparedQuery.large + 1))]}}}"#)
        drain()
        #expect(h.engine.takeGarbage().isEmpty)
        c.ok(#"{"op":"unsubscribe","sub":"q"}"#)
        drain()
        #expect(h.engine.takeGarbage().count == 2)
        // Without a taker, nothing is kept.
        h.engine.collectsGarbage = false
        c.ok(#"{"op":"get","query":{"type":"Post","where":{"path":"date","in":[\#(list(PreparedQuery.large))]}}}"#)
        drain()
        #expect(h.engine.takeGarbage().isEmpty)
    }
}

/// The compiled forms against the definitions they stand for.
@Suite struct CompiledConditionTests {
    /// Orderings of integers take a shortcut (one integer comparison);
    /// every other pair goes the general way. Both agree with ``QueryEval``.
    @Test func comparisonsAgreeWithTheDefinition() {
        let lexemes = ["0", "-0", "7", "-7", "12", "999999999999999", "-999999999999999", "1000000000000000",
                       "12345678901234567890", "1.5", "12.0", "1e1", "1.2e1", "-1E-3", "0.0"]
        var values: [JSON] = lexemes.map { .number(JSONNumber(unchecked: $0)) }
        values += [.string("12"), .string("a"), .null, .bool(true), .array([.int(1)])]
        for arg in values {
            for op in QueryCondition.Comparison.allCases {
                let c = QueryCondition.compare(["n"], op, arg)
                let compiled = CompiledCondition(c)
                for x in values {
                    let v = JSON.object(JSONObject([.init(key: "n", value: x)]))
                    #expect(compiled.matches(v) == QueryEval.matches(v, c), "\(x.compactString) \(op) \(arg.compactString)")
                }
                #expect(compiled.matches(.object(JSONObject())) == QueryEval.matches(.object(JSONObject()), c))
            }
        }
    }

    @Test func anIdentityIsOfTheTypeBeforeItsFirstColon() {
        for (id, type) in [("Post:1", "Post"), ("Post:1", "Pos"), ("Post:1", "Post:"), ("Post", "Post"), (":x", ""),
                           ("x", ""), ("Post:a:b", "Post"), ("Pöst:1", "Pöst"), ("Pöst:1", "Post"), ("Person:1", "Post")] {
            #expect(Engine.isOfType(id, type) == (Tree.type(of: id) == type), "\(id) \(type)")
        }
    }
}

@Suite struct StringOrderTests {
    /// Small ASCII strings are ordered from their words; the result must be
    /// the byte order whatever the lengths, zero bytes and kinds of string.
    @Test func wordsOrderAsBytes() {
        var rng = SystemRandomNumberGenerator()
        let alphabet: [UInt8] = [0, 1, 0x3A, 0x41, 0x61, 0x7E, 0x7F]
        func random() -> String {
            let n = Int.random(in: 0...18, using: &rng)
            var bytes = (0..<n).map { _ in alphabet.randomElement(using: &rng)! }
            if Int.random(in: 0..<8, using: &rng) == 0 { bytes.append(contentsOf: Array("é".utf8)) }
            return String(decoding: bytes, as: UTF8.self)
        }
        for _ in 0..<20_000 {
            let a = random(), b = Bool.random(using: &rng) ? random() : a + ""
            #expect(QueryEval.compareStrings(a, b) == QueryEval.compareUTF8(a, b), "\(Array(a.utf8)) \(Array(b.utf8))")
        }
        #expect(QueryEval.compareStrings("Post:9", "Post:10") == 1)
        #expect(QueryEval.compareStrings("a", "a\u{0}") == -1)
        #expect(QueryEval.compareStrings("", "") == 0)
    }
}
