import Testing

@testable import ConcordJSON

/// `hasSameEncoding`: true exactly when the writer writes both values as
/// the same bytes (and then they are equal).
struct SameEncodingTests {
    func v(_ s: String) -> JSON { try! JSONParser().parse(s) }

    @Test func spelledAlikeExactlyWhenWrittenAlike() {
        let cases: [(String, String)] = [
            (#"{"a":1,"b":[1,2,{"c":null}]}"#, #"{"a":1,"b":[1,2,{"c":null}]}"#),
            (#"{"a":1,"b":2}"#, #"{"b":2,"a":1}"#),
            (#"1.50"#, #"1.5"#),
            (#"[1,2]"#, #"[1,2,3]"#),
            (#""x""#, #""y""#),
            (#"{"a":"\u00e9"}"#, #"{"a":"é"}"#),
            (#"{"a":"e\u0301"}"#, #"{"a":"é"}"#),
            (#"{}"#, #"[]"#),
            (#"{}"#, #"{}"#),
            (#"true"#, #"true"#),
            (#"null"#, #"false"#),
            (#"{"a":{"b":[{"c":1}]}}"#, #"{"a":{"b":[{"c":1.0}]}}"#),
        ]
        for (a, b) in cases {
            let x = v(a), y = v(b)
            let written = x.encoded() == y.encoded()
            #expect(x.hasSameEncoding(as: y) == written, "\(a) vs \(b)")
            #expect(y.hasSameEncoding(as: x) == written, "\(b) vs \(a)")
            if written { #expect(x == y) }
        }
    }
}

/// `likeness(to:)`: in one pass, what `hasSameEncoding` and `==` say
/// together, for every pair (objects in the same member order, in another,
/// nested, numbers spelled otherwise, a difference before or after one).
struct LikenessTests {
    func v(_ s: String) -> JSON { try! JSONParser().parse(s) }

    @Test func oneVerdictAgreeingWithBothComparisons() {
        let values = [
            #"{"id":"P:1","a":1,"b":[1,2,{"c":null}]}"#,
            #"{"id":"P:1","a":1.0,"b":[1,2,{"c":null}]}"#,
            #"{"id":"P:1","a":1,"b":[1,2,{"c":0}]}"#,
            #"{"id":"P:1","a":2,"b":[1,2,{"c":null}]}"#,
            #"{"id":"P:1","b":[1,2,{"c":null}],"a":1}"#,
            #"{"id":"P:1","b":[1,2,{"c":null}],"a":1.0}"#,
            #"{"id":"P:1","a":1,"b":[1,2,{"c":null}],"d":1}"#,
            #"{"id":"P:1","a":1.0,"b":[1,2,{"c":1}]}"#,
            #"{"id":"P:1","x":1,"b":[1,2,{"c":null}]}"#,
            #"{"id":"P:1","a":1,"b":[1,2,{"c":null,"d":1}]}"#,
            #"{"id":"P:1","a":1,"b":[1,2,{"c":null}]}"#,
            #"{}"#, #"[]"#, #"[1,2]"#, #"[1,2.0]"#, #"1.50"#, #"1.5"#, #""x""#, #"null"#,
        ]
        var verdicts: Set<String> = []
        for a in values {
            for b in values {
                let x = v(a), y = v(b)
                let expected: JSONLikeness = x.hasSameEncoding(as: y) ? .sameEncoding : (x == y ? .equal : .different)
                #expect(x.likeness(to: y) == expected, "\(a) vs \(b)")
                verdicts.insert("\(expected)")
            }
        }
        #expect(verdicts == ["sameEncoding", "equal", "different"])
        // One buffer is one value.
        let shared = v(values[0])
        #expect(shared.likeness(to: shared) == .sameEncoding)
    }
}

/// `JSONObject.merge`: the member as given, unless it is already written
/// as the same bytes — then the member list is left as it is (a list
/// shared with another value is not copied).
struct ObjectMergeTests {
    func object(_ s: String) -> JSONObject { try! JSONParser().parse(s).objectValue! }
    func v(_ s: String) -> JSON { try! JSONParser().parse(s) }

    @Test func aMemberWrittenAlikeLeavesTheListShared() {
        let stored = object(#"{"id":"P:1","name":"Ann","tags":["a","b"]}"#)
        var merged = stored
        merged.merge("name", v(#""Ann""#))
        merged.merge("tags", v(#"["a","b"]"#))
        #expect(sameBuffer(merged.members, stored.members))
        #expect(JSON.object(merged).encoded() == JSON.object(stored).encoded())
    }

    @Test func aMemberEqualButSpelledOtherwiseIsWritten() {
        // `==` calls 1 and 1.0 equal; the stored bytes must follow the update.
        let stored = object(#"{"id":"P:1","n":1,"m":{"b":2,"a":1}}"#)
        var merged = stored
        merged.merge("n", v("1.0"))
        merged.merge("m", v(#"{"a":1,"b":2}"#))
        #expect(!sameBuffer(merged.members, stored.members))
        #expect(String(decoding: JSON.object(merged).encoded(), as: UTF8.self) == #"{"id":"P:1","n":1.0,"m":{"a":1,"b":2}}"#)
        #expect(String(decoding: JSON.object(stored).encoded(), as: UTF8.self) == #"{"id":"P:1","n":1,"m":{"b":2,"a":1}}"#)
    }

    @Test func aNewMemberIsAddedLast() {
        var merged = object(#"{"id":"P:1"}"#)
        merged.merge("name", v(#""Bo""#))
        merged.merge("id", v(#""P:1""#))
        #expect(String(decoding: JSON.object(merged).encoded(), as: UTF8.self) == #"{"id":"P:1","name":"Bo"}"#)
    }
}
