import ConcordJSON
import Foundation
import Testing

/// Defects an independent check found (issue 10), through the real server.
@Suite(.serialized)
struct RegressionTests {
    @Test func refreshReplacesNestedEntitiesOverTheWire() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        try c.request(#"{"op":"update","model":{"id":"P:1","name":"new"}}"#)
        let r = try c.request(#"{"op":"subscribe","sub":"s","refresh":true,"model":{"id":"R:1","p":{"id":"P:1","name":"old"},"l":[{"id":"P:1","name":"old"}]}}"#)
        #expect(r["model"]?["p"]?["name"] == "new")
        #expect(r["model"]?["l"]?.arrayValue?.first?["name"] == "new")
        #expect(server.stop() == 0)
    }

    @Test func resumeTakesTheContextOfTheLastChangeNotOfAForcedNoOp() throws {
        let server = try ServerProcess()
        let a = try server.connect()
        let w = try server.connect()
        try w.request(#"{"op":"update","key":"doc","model":{"id":"P:1","n":0}}"#)
        try a.request(#"{"op":"subscribe","sub":"s","key":"doc"}"#)
        try a.request(#"{"op":"pause","sub":"s"}"#)
        try w.request(#"{"op":"update","model":{"id":"P:1","n":1},"context":"c1"}"#)
        try w.request(#"{"op":"update","model":{"id":"Other:1"},"context":"unrelated"}"#)
        try w.request(#"{"op":"update","model":{"id":"P:1","n":1}}"#)
        try w.request(#"{"op":"update","model":{"id":"P:1","n":1},"force":true,"context":"forced no-op"}"#)
        try a.request(#"{"op":"resume","sub":"s"}"#)
        let events = a.take()
        #expect(events.count == 1)
        #expect(events.first?["context"] == "c1")
        #expect(server.stop() == 0)
    }

    /// The memory backend freed nothing on `clear` (neighbours kept each other alive).
    @Test(.disabled(if: Sanitizer.active, Sanitizer.jemallocReason))
    func theMemoryBackendFreesWhatClearRemoves() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        let blob = String(repeating: "z", count: 1000)
        func round(_ r: Int) throws -> Int {
            var text = ""
            for i in 0..<3000 { text += #"{"op":"update","model":{"id":"E:\#(i)","r":\#(r),"b":"\#(blob)"}}"# + "\n" }
            try c.write(text)
            for _ in 0..<3000 { _ = try c.response() }
            try c.request(#"{"op":"clear"}"#)
            try c.request(#"{"op":"ping"}"#)  // the storage thread has applied the clear by the next round
            return try c.request(#"{"op":"stats"}"#)["memory"]?["allocated"]?.numberValue?.intValue ?? 0
        }
        _ = try round(0)
        let first = try round(1)
        var last = first
        for r in 2..<6 { last = try round(r) }
        // Four more rounds of ~4 MB each: a leak would add ~16 MB.
        #expect(last - first < 4 << 20, "allocated grew from \(first >> 20) MiB to \(last >> 20) MiB")
        #expect(server.stop() == 0)
    }
}
