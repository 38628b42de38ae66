import ConcordJSON
import Testing

@testable import ConcordCore

/// An author's posts are refreshed in place and journaled without a copy of
/// their value (`EntityRecord.beforeNotKept`); whoever asks for a post's
/// value from before the mutation gets it rebuilt. With the internal checks
/// on (as here), every rebuilt value is compared with a copy kept aside.
/// These cover what asks: a query whose condition reads through the author,
/// a paused subscription, a later op of the same batch writing or deleting
/// a post or the author, and a rollback.
struct RefreshInPlaceTests {
    func harness() -> EngineHarness {
        var cfg = EngineConfiguration()
        cfg.internalChecks = true
        cfg.maxDepth = 8
        let h = EngineHarness(configuration: cfg)
        let w = h.connect()
        for i in 0..<10 {
            w.ok(#"{"op":"update","model":{"id":"P:\#(i)","n":\#(i),"author":{"id":"U:1","name":"a"}}}"#)
        }
        w.ok(#"{"op":"update","model":{"id":"P:10","n":10,"author":{"id":"U:2","name":"a"}}}"#)
        return h
    }

    func post(_ h: EngineHarness, _ c: TestConn, _ i: Int) -> JSON { c.send(#"{"op":"get","id":"P:\#(i)"}"#)["model"] ?? .null }

    @Test func aQueryThroughTheAuthorSeesThePostsLeaveAndComeBack() {
        let h = harness()
        let a = h.connect()
        let r = a.ok(#"{"op":"subscribe","sub":"q","query":{"type":"P","where":{"path":"author.name","eq":"a"},"order":[{"path":"n"}]}}"#)
        #expect(r["items"]?.arrayValue?.count == 11)
        a.ok(#"{"op":"update","model":{"id":"U:1","name":"b"}}"#)
        let left = a.take().filter { $0["sub"] == "q" }
        // Ten leave, P:10 (another author) stays.
        #expect(left.count == 1)
        let removeFirst = Array(repeating: #"{"op":"remove","index":0,"count":1}"#, count: 10).joined(separator: ",")
        #expect(left.first?["changes"] == json("[\(removeFirst)]"))
        a.ok(#"{"op":"update","model":{"id":"U:1","name":"a"}}"#)
        let back = a.take().filter { $0["sub"] == "q" }
        #expect(back.count == 1)
        let inserts = (0..<10).map { #"{"op":"insert","index":\#($0),"items":[{"id":"P:\#($0)","n":\#($0),"author":{"id":"U:1","name":"a"}}]}"# }
        #expect(back.first?["changes"] == json("[\(inserts.joined(separator: ","))]"))
        #expect(h.engine.store.invariantViolations().isEmpty)
    }

    @Test func aPausedSubscriptionResumesWithTheChange() {
        let h = harness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"i","ids":["P:5"]}"#)
        _ = a.take()
        a.ok(#"{"op":"pause","sub":"i"}"#)
        a.ok(#"{"op":"update","model":{"id":"U:1","name":"b"}}"#)
        a.ok(#"{"op":"update","model":{"id":"U:1","name":"c"}}"#)
        #expect(a.take().isEmpty)
        a.ok(#"{"op":"resume","sub":"i"}"#)
        let ev = a.take().filter { $0["sub"] == "i" }
        #expect(ev.count == 1)
        #expect(ev.first?["model"] == json(#"{"id":"P:5","n":5,"author":{"id":"U:1","name":"c"}}"#))
    }

    @Test func laterOpsOfTheBatchWriteAndDeleteRefreshedPosts() {
        let h = harness()
        let a = h.connect()
        a.ok(#"{"op":"batch","ops":[{"op":"update","model":{"id":"U:1","name":"b"}},{"op":"update","mode":"merge","model":{"id":"P:2","n":99}},{"op":"delete","id":"P:3"},{"op":"update","model":{"id":"U:1","name":"c"}}]}"#)
        #expect(post(h, a, 2) == json(#"{"id":"P:2","n":99,"author":{"id":"U:1","name":"c"}}"#))
        #expect(post(h, a, 3) == .null)
        #expect(post(h, a, 4) == json(#"{"id":"P:4","n":4,"author":{"id":"U:1","name":"c"}}"#))
        // The author renamed, then deleted, in one batch: its posts lose it.
        a.ok(#"{"op":"batch","ops":[{"op":"update","model":{"id":"U:1","name":"d"}},{"op":"delete","id":"U:1"}]}"#)
        #expect(post(h, a, 4) == json(#"{"id":"P:4","n":4,"author":null}"#))
        #expect(h.engine.store.invariantViolations().isEmpty)
    }

    @Test func aFailedBatchRestoresEveryRefreshedPost() {
        let h = harness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"q","query":{"type":"P","where":{"path":"author.name","eq":"a"}}}"#)
        _ = a.take()
        let before = (0...10).map { post(h, a, $0) }
        let seq = h.engine.seq
        // Renamed, a post written and one deleted, renamed again, then a
        // merge that would make the author contain its own post: the whole
        // batch is rolled back.
        #expect(a.error(#"{"op":"batch","ops":[{"op":"update","model":{"id":"U:1","name":"b"}},{"op":"update","mode":"merge","model":{"id":"P:2","n":99}},{"op":"delete","id":"P:7"},{"op":"update","model":{"id":"U:1","name":"c"}},{"op":"update","mode":"merge","model":{"id":"U:1","p":{"id":"P:1"}}}]}"#) == "bad_request")
        #expect(h.engine.seq == seq)
        #expect((0...10).map { post(h, a, $0) } == before)
        #expect(a.take().isEmpty)
        // And the store goes on from there: the query still holds the eleven
        // (by identity: P:0, P:1, P:10, P:2, …; all but P:10 leave).
        a.ok(#"{"op":"update","model":{"id":"U:1","name":"z"}}"#)
        let removes = ["0", "0"] + Array(repeating: "1", count: 8)
        let ev = a.take().filter { $0["sub"] == "q" }
        #expect(ev.count == 1)
        #expect(ev.first?["changes"] == json("[\(removes.map { #"{"op":"remove","index":\#($0),"count":1}"# }.joined(separator: ","))]"))
        #expect(h.engine.store.invariantViolations().isEmpty)
    }
}
