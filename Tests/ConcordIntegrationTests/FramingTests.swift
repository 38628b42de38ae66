import ConcordJSON
import ConcordTestServer
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Framing edge cases against the real server process (PROTOCOL.md §1).
@Suite(.serialized)
struct FramingTests {
    @Test(arguments: [1, 2, 3, 7, 64, 4096])
    func linesSplitAcrossReadsAreReassembled(chunk: Int) throws {
        let server = try ServerProcess()
        let c = try server.connect()
        let text = #"{"op":"ping","rid":"a"}"# + "\n" + #"{"op":"update","model":{"id":"A","s":"é✓"},"rid":"b"}"# + "\n"
        let bytes = Array(text.utf8)
        var i = 0
        while i < bytes.count {
            try c.write(Array(bytes[i..<min(i + chunk, bytes.count)]))
            i += chunk
            usleep(200)
        }
        #expect(try c.response()["rid"] == "a")
        let r = try c.response()
        #expect(r["rid"] == "b")
        #expect(r["seq"] == 1)
        #expect(try c.request(#"{"op":"get","id":"A"}"#)["model"]?["s"] == "é✓")
    }

    @Test func manyLinesInOneWriteAnswerInOrder() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        var text = ""
        for i in 0..<500 { text += #"{"op":"update","model":{"id":"N:\#(i % 7)","v":\#(i)},"rid":\#(i)}"# + "\n" }
        try c.write(text)
        for i in 0..<500 {
            let r = try c.response()
            #expect(r["rid"] == .int(i))
            #expect(r["seq"] == .int(i + 1))
        }
    }

    @Test func crlfBlankLinesAndWhitespaceOnlyLines() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        try c.write("\n\r\n   \t \n" + #"{"op":"ping","rid":1}"# + "\r\n\n" + #"{"op":"ping","rid":2}"# + "\n")
        #expect(try c.response()["rid"] == 1)
        #expect(try c.response()["rid"] == 2)
    }

    @Test func invalidUTF8IsAParseErrorAndTheConnectionLives() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        var bad = Array(#"{"op":"ping","rid":"x"#.utf8)
        bad += [0xC3, 0x28]
        bad += Array("\"}\n".utf8)
        try c.write(bad)
        let r = try c.response()
        #expect(r["ok"] == false)
        #expect(r["error"]?["code"] == "parse_error")
        #expect(try c.request(#"{"op":"ping","rid":3}"#)["rid"] == 3)
    }

    @Test func aSeventeenMebibyteLineIsTooLargeAndSkipped() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        var big = Array(#"{"op":"update","model":{"id":"Big","blob":""#.utf8)
        big += [UInt8](repeating: UInt8(ascii: "x"), count: 17 << 20)
        big += Array("\"}}\n".utf8)
        big += Array(#"{"op":"ping","rid":"after"}"#.utf8) + [0x0A]
        try c.write(big)
        let r = try c.response()
        #expect(r["error"]?["code"] == "too_large")
        #expect(r["rid"] == .null)
        #expect(try c.response()["rid"] == "after")
        #expect(try c.request(#"{"op":"get","id":"Big"}"#)["model"] == .null)
        // The server did not buffer the line whole (jemalloc's figure; not under a sanitizer).
        guard !Sanitizer.active else { return }
        let stats = try c.request(#"{"op":"stats"}"#)
        let allocated = stats["memory"]?["allocated"]?.numberValue?.intValue ?? 0
        #expect(allocated > 0)
        #expect(allocated < 17 << 20)
    }

    @Test func depthTwoHundredIsTooDeep() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        let nested = String(repeating: "[", count: 198) + String(repeating: "]", count: 198)
        let r = try c.request(#"{"op":"update","model":{"id":"D","x":\#(nested)}}"#)
        #expect(r["error"]?["code"] == "too_deep")
        let ok = try ServerProcess(arguments: ["--max-depth", "300"])
        let d = try ok.connect()
        #expect(try d.request(#"{"op":"update","model":{"id":"D","x":\#(nested)}}"#)["ok"] == true)
        #expect(try d.request(#"{"op":"get","id":"D"}"#)["model"]?["id"] == "D")
    }

    @Test func nonObjectLinesAndBadRids() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        for line in ["42", "\"op\"", "null", "[]", "{\"op\":\"ping\"", "\u{FEFF}{\"op\":\"ping\"}", "{\"op\":\"ping\",\"n\":NaN}"] {
            let r = try c.request(line)
            #expect(r["error"]?["code"] == "parse_error", "line \(line)")
        }
        let r = try c.request(#"{"op":"ping","rid":[1]}"#)
        #expect(r["error"]?["code"] == "bad_request")
        #expect(r["rid"] == .null)
    }
}
