import ConcordJSON
import Testing

@testable import ConcordCore

/// §3 `refresh` replaces every known entity at any depth; §5 `resume` carries
/// the context of the last mutation that changed the view (a forced write
/// that changes nothing did not).
struct ResumeAndRefreshTests {
    @Test func refreshReplacesKnownEntitiesAtAnyDepthAndEveryOccurrence() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","model":{"id":"P:1","name":"new"}}"#)
        let r = a.ok(#"{"op":"subscribe","sub":"s","refresh":true,"model":{"id":"R:1","p":{"id":"P:1","name":"old"},"list":[{"id":"P:1","name":"old"},{"x":{"id":"P:1"}}]}}"#)
        let m = r["model"]!
        #expect(m["p"]?["name"] == "new")
        #expect(m["list"]?.arrayValue?[0]["name"] == "new")
        #expect(m["list"]?.arrayValue?[1]["x"]?["name"] == "new")
        #expect(m["id"] == "R:1", "an unknown root keeps its own members")
        // The view watches what it now holds.
        a.ok(#"{"op":"update","model":{"id":"P:1","name":"newer"}}"#)
        #expect(a.take().last?["model"]?["p"]?["name"] == "newer")
    }

    /// The issue's sequence, for every kind of view.
    @Test(arguments: ["model", "key", "ids", "collection"])
    func resumeCarriesTheContextOfTheLastRealChange(kind: String) {
        let h = EngineHarness()
        let a = h.connect()
        let w = h.connect()
        w.ok(#"{"op":"update","key":"doc","model":{"id":"P:1","n":0}}"#)
        w.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"P:1","n":0}]}"#)
        switch kind {
        case "model": a.ok(#"{"op":"subscribe","sub":"s","model":{"id":"P:1","n":0}}"#)
        case "key": a.ok(#"{"op":"subscribe","sub":"s","key":"doc"}"#)
        case "ids": a.ok(#"{"op":"subscribe","sub":"s","ids":["P:1"]}"#)
        default: a.ok(#"{"op":"subscribe","sub":"s","collection":"c"}"#)
        }
        a.ok(#"{"op":"pause","sub":"s"}"#)
        w.ok(#"{"op":"update","model":{"id":"P:1","n":1},"context":"c1"}"#)
        w.ok(#"{"op":"update","model":{"id":"Other:1","n":1},"context":"unrelated"}"#)
        w.ok(#"{"op":"update","model":{"id":"P:1","n":1},"context":"no-op"}"#)
        w.ok(#"{"op":"update","model":{"id":"P:1","n":1},"force":true,"context":"forced no-op"}"#)
        _ = a.take()
        a.ok(#"{"op":"resume","sub":"s"}"#)
        let events = a.take()
        #expect(events.count == 1, "\(kind): \(events.map { $0.compactString })")
        #expect(events.first?["context"] == "c1", "\(kind)")
    }
}
