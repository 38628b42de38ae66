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
