import ConcordJSON
import ConcordTestSupport
import Testing

@testable import ConcordProtocol

/// `UpdateLine.read` (an update read from its bytes) against the full
/// parse and `Request.decode`: every line it reads decodes to the same
/// request, and every line it does not read is left to the decoder.
struct UpdateLineTests {
    static var parser: JSONParser { JSONParser(maxDepth: 8) }

    static func read(_ line: String) -> UpdateLine? {
        Array(line.utf8).withUnsafeBufferPointer { UpdateLine.read($0, parser: parser) }
    }

    /// What the full path makes of the line: the request (or nil when it
    /// is refused) and where the model's bytes lie when they are verbatim.
    static func full(_ line: String) -> (request: Request?, model: Range<Int>?) {
        guard let (value, range) = try? parser.parse(Array(line.utf8), verbatimMember: "model") else { return (nil, nil) }
        return (try? Request.decode(value, idKey: "id"), range)
    }

    /// Checks one line: when read, the full path accepts it with the same
    /// request and the same model range. Returns whether it was read.
    @discardableResult
    static func check(_ line: String, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        guard let u = read(line) else { return false }
        let (request, range) = full(line)
        guard let request else {
            Issue.record("read, but the full path refuses it: \(line)", sourceLocation: sourceLocation)
            return true
        }
        #expect(u.request.decodedText == request.decodedText, "\(line)", sourceLocation: sourceLocation)
        #expect(u.modelRange == range, "\(line)", sourceLocation: sourceLocation)
        if case .object(let o) = u.json, let again = try? Request.decode(.object(o), idKey: "id") {
            #expect(again.decodedText == request.decodedText, "json of \(line)", sourceLocation: sourceLocation)
        } else {
            Issue.record("its json does not decode: \(line)", sourceLocation: sourceLocation)
        }
        return true
    }

    @Test func theCommonUpdateIsReadInAnyMemberOrder() {
        let model = #"{"id":"Doc:1","title":"A","author":{"id":"Person:1","name":"Ann"},"tags":["a","b"],"n":1.5e3}"#
        let lines = [
            #"{"op":"update","model":\#(model)}"#,
            #"{"op":"update","key":"k1","model":\#(model),"rid":7}"#,
            #"{"rid":"r-1","model":\#(model),"op":"update","key":"k1"}"#,
            #"{"model":\#(model),"op":"update"}"#,
            #"{"op":"update","rid":null,"model":{}}"#,
            #"{"op":"update","rid":true,"key":"ключ","model":{"id":"é"}}"#,
            #"{"op":"update","model":\#(model),"mode":"merge","force":true}"#,
            #"{"op":"update","model":\#(model),"key":null,"mode":"replace","force":false}"#,
            #"{"token":"t-1","op":"update","model":\#(model),"if_unchanged_since":12,"context":{"why":[1]},"origin":"s"}"#,
            #"{"op":"update","model":\#(model),"context":null,"token":null}"#,
        ]
        for line in lines { #expect(Self.check(line), "not read: \(line)") }
        let u = Self.read(#"{"rid":3,"op":"update","key":"k","model":\#(model)}"#)
        if case .update(_, let key, _, _)? = u?.mutation { #expect(key == "k") } else { Issue.record("not an update") }
        #expect(u?.modelRange == 41 ..< 41 + model.utf8.count)
        if case .number(let n)? = u?.rid { #expect(n.text == "3") } else { Issue.record("rid") }
    }

    /// A model whose bytes are not the writer's is read, without a range.
    @Test func anIrregularModelIsReadWithoutItsRange() {
        let line = #"{"op":"update","model":{ "id" : "A:1","s":"\u0041"}}"#
        #expect(Self.check(line))
        #expect(Self.read(line)?.modelRange == nil)
    }

    @Test func everyOtherLineIsLeftToTheDecoder() {
        let left = [
            #"{"op":"update","model":{},"unknown":1}"#,                    // a member the decoder ignores
            #"{"op":"update","model":{},"mode":"merged"}"#,                // a value the decoder refuses
            #"{"op":"update","model":{},"force":1}"#,
            #"{"op":"update","model":{},"token":7}"#,
            #"{"op":"update","model":{},"origin":""}"#,
            #"{"op":"update","model":{},"if_unchanged_since":-1}"#,
            #"{"op":"delete","id":"A:1"}"#,                                 // another op
            #"{"op":"updates","model":{}}"#,
            #"{"op":"update"}"#,                                            // no model
            #"{"model":{}}"#,                                               // no op
            #"{"op":"update","model":[]}"#,                                 // wrong types
            #"{"op":"update","model":{},"key":1}"#,
            #"{"op":"update","model":{},"rid":{}}"#,
            #"{"op":"update","model":{},"rid":[1]}"#,
            #"{"op":"update","model":{},"model":{}}"#,                      // repeated names
            #"{"op":"update","op":"update","model":{}}"#,
            #"{"op":"update","rid":1,"rid":2,"model":{}}"#,
            #"{ "op":"update","model":{}}"#,                                // whitespace
            #"{"op": "update","model":{}}"#,
            #"{"op":"update" ,"model":{}}"#,
            #"{"op":"update","model":{}} "#,
            #"{"\u006fp":"update","model":{}}"#,                            // an escaped name
            #"{"op":"upd\u0061te","model":{}}"#,                            // an escaped value
            #"{"op":"update","model":{}}x"#,                                // not JSON
            #"{"op":"update","model":{"a":}}"#,
            #"{"op":"update","model":{},}"#,
            #"{"op":"update","model":{}"#,
            #"{"op":"update","model":{"a":[[[[[[[[[]]]]]]]]]}}"#,           // too deep (8)
            #"["op","update"]"#,
            #"{}"#,
            "",
        ]
        for line in left { #expect(Self.read(line) == nil, "read: \(line)") }
    }

    /// Random lines made of the members an update may carry, in random
    /// order, some repeated, some of the wrong type, some irregular: every
    /// line read decodes the same through the full path, and every regular
    /// one made only of names an update reads, once each, that the full
    /// path accepts is read.
    @Test func randomLinesReadTheSameAsTheFullPath() {
        var rng = SeededRandom(seed: 19)
        let values = [#"1"#, #"-0.5e2"#, #""s""#, #""ü""#, "null", "true", #"{}"#, #"[1]"#, #"{"id":"A:1","x":[1,{"y":null}]}"#,
                      #"{"id":"A:1","n":{"id":"B:2"}}"#, #""a\"b""#]
        let names = ["op", "rid", "key", "model", "mode", "force", "other", "token", "context", "origin", "if_unchanged_since"]
        let known: Set<String> = ["op", "rid", "key", "model", "mode", "force", "token", "context", "origin", "if_unchanged_since"]
        var read = 0, mustRead = 0
        for _ in 0 ..< 4000 {
            var members: [String] = []
            var plain = true
            var used = Set<String>()
            // Most lines start from an update's two members (in random order below).
            var chosen = rng.next() % 4 == 0 ? [] : ["op", "model"]
            for _ in 0 ..< Int(rng.next() % 4) { chosen.append(names[Int(rng.next() % UInt64(names.count))]) }
            for i in chosen.indices.reversed() { chosen.swapAt(i, Int(rng.next() % UInt64(i + 1))) }
            for name in chosen {
                let value: String
                switch name {
                case "op": value = rng.next() % 8 == 0 ? #""delete""# : #""update""#
                case "model": value = rng.next() % 6 == 0 ? values[Int(rng.next() % UInt64(values.count))] : values[8 + Int(rng.next() % 2)]
                case "key": value = rng.next() % 4 == 0 ? values[Int(rng.next() % UInt64(values.count))] : #""k""#
                case "mode": value = [#""merge""#, #""replace""#, #""x""#, "null", "1"][Int(rng.next() % 5)]
                case "if_unchanged_since": value = ["3", "0", "-1", "1.5", "null", #""3""#][Int(rng.next() % 6)]
                default: value = values[Int(rng.next() % UInt64(values.count))]
                }
                // Only names the decoder reads, once each; what their values
                // make of the request is the full path's to say (below).
                if !known.contains(name) || used.contains(name) { plain = false }
                if name == "op" && value != #""update""# { plain = false }
                used.insert(name)
                let space = rng.next() % 10 == 0 ? " " : ""
                if space == " " { plain = false }
                members.append("\"\(name)\":\(space)\(value)")
            }
            let line = "{" + members.joined(separator: ",") + "}"
            if Self.full(line).request == nil { plain = false }
            let wasRead = Self.check(line)
            if wasRead { read += 1 }
            if plain {
                mustRead += 1
                #expect(wasRead, "a plain update not read: \(line)")
            }
        }
        #expect(mustRead > 500 && read >= mustRead, "read \(read), plain \(mustRead)")
    }
}
