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

/// Stored values nest at most `--max-depth` − 1 levels however entities are
/// combined, so every reader of them can bound its recursion.
struct StoredDepthTests {
    static func nested(_ levels: Int, id: String) -> String {
        // An entity object holding `levels - 1` more nested plain objects.
        var s = "0"
        for _ in 0..<(levels - 1) { s = #"{"x":\#(s)}"# }
        return #"{"id":"\#(id)","x":\#(s)}"#
    }

    @Test func combiningEntitiesBeyondTheDepthLimitIsRefusedAndChangesNothing() {
        var config = EngineConfiguration()
        config.maxDepth = 10
        let h = EngineHarness(configuration: config)
        let a = h.connect()
        // P:1 is 6 deep; Q:1 holds it one object down: 2 + 6 = 8 ≤ 9.
        // (Merge mode: a reference keeps the entity's members.)
        a.ok(#"{"op":"update","model":\#(Self.nested(6, id: "P:1"))}"#)
        a.ok(#"{"op":"update","mode":"merge","model":{"id":"Q:1","a":{"b":{"id":"P:1"}}}}"#)
        #expect(h.engine.store.entity("Q:1")?.nests(deeperThan: 8) == false)
        #expect(h.engine.store.entity("Q:1")?.nests(deeperThan: 7) == true)
        // R:1 holds Q:1 one object down: 2 + 8 = 10 > 9: refused, nothing applied, no seq taken.
        let seq = h.engine.seq
        #expect(a.error(#"{"op":"update","mode":"merge","model":{"id":"R:1","a":{"b":{"id":"Q:1"}}}}"#) == "too_deep")
        #expect(h.engine.store.entity("R:1") == nil)
        #expect(h.engine.seq == seq)
        // Growing a nested entity deepens every holder: refused too (P:1 at 8 makes Q:1 10).
        #expect(a.error(#"{"op":"update","model":\#(Self.nested(8, id: "P:1"))}"#) == "too_deep")
        #expect(h.engine.store.entity("P:1")?.nests(deeperThan: 6) == false)
        // A document is held to the same bound.
        #expect(a.error(#"{"op":"update","mode":"merge","key":"k","model":{"a":{"b":{"id":"Q:1"}}}}"#) == "too_deep")
        #expect(h.engine.store.document("k") == nil)
    }

    /// Holders refreshed by substitution are walked only when a written
    /// entity they hold nests deeper than before: a grandchild's growth
    /// reaches the grandparent, a rename that keeps the depth does not.
    @Test func aGrandchildGrowingPastTheLimitThroughItsHoldersIsRefused() {
        var config = EngineConfiguration()
        config.maxDepth = 10
        let h = EngineHarness(configuration: config)
        let a = h.connect()
        // C:1 is 3 deep; B:1 holds it 1 down (4); A:1 holds B:1 2 down (6).
        a.ok(#"{"op":"update","model":\#(Self.nested(3, id: "C:1"))}"#)
        a.ok(#"{"op":"update","mode":"merge","model":{"id":"B:1","c":{"id":"C:1"}}}"#)
        a.ok(#"{"op":"update","mode":"merge","model":{"id":"A:1","a":{"b":{"id":"B:1"}}}}"#)
        #expect(h.engine.store.entity("A:1")?.height(cappedAt: 20) == 6)
        // Same depth, new value: every holder refreshed, nothing refused.
        a.ok(#"{"op":"update","model":{"id":"C:1","x":{"x":{"y":1}}}}"#)
        #expect(h.engine.store.entity("A:1")?["a"]?["b"]?["c"]?["x"]?["x"]?["y"] == 1)
        // C:1 at 6: B:1 7, A:1 9 ≤ 9: taken.
        a.ok(#"{"op":"update","model":\#(Self.nested(6, id: "C:1"))}"#)
        #expect(h.engine.store.entity("A:1")?.height(cappedAt: 20) == 9)
        // C:1 at 7 makes B:1 8 (fine) and A:1 10 (> 9): refused, all unchanged.
        let seq = h.engine.seq
        #expect(a.error(#"{"op":"update","model":\#(Self.nested(7, id: "C:1"))}"#) == "too_deep")
        #expect(h.engine.seq == seq)
        #expect(h.engine.store.entity("A:1")?.height(cappedAt: 20) == 9)
        #expect(h.engine.store.entity("C:1")?.height(cappedAt: 20) == 6)
        // In a batch, the growth comes from an earlier op's write: refused too.
        #expect(a.error(#"{"op":"batch","ops":[{"op":"update","model":{"id":"D:1","v":1}},{"op":"update","model":\#(Self.nested(7, id: "C:1"))}]}"#) == "too_deep")
        #expect(h.engine.store.entity("D:1") == nil)
        #expect(h.engine.store.invariantViolations().isEmpty)
    }
}

/// A key's only subscription is filed alone under its key; a second makes
/// a shared view, and leaving it one again files the last alone. Every
/// step must keep delivering to exactly the live subscriptions, pauses
/// included (their state is kept by the client, keyed by the subscription).
struct KeySubscriberTests {
    /// A key whose document is one entity: the changed and deleted lists
    /// when it holds no entity before and after (the common case, taken
    /// without comparing the trees), and when it gains or loses one.
    @Test func aDocumentThatIsOneEntityListsExactlyWhatChanged() {
        let h = EngineHarness()
        let w = h.connect(), a = h.connect()
        w.ok(#"{"op":"update","key":"doc","model":{"id":"X:1","n":0}}"#)
        a.ok(#"{"op":"subscribe","sub":"s","key":"doc"}"#)
        func lists() -> [[String]] {
            guard let e = a.take().last else { return [] }
            return [e["changed"]?.arrayValue?.compactMap(\.stringValue) ?? [], e["deleted"]?.arrayValue?.compactMap(\.stringValue) ?? []]
        }
        w.ok(#"{"op":"update","key":"doc","model":{"id":"X:1","n":1}}"#)
        #expect(lists() == [["X:1"], []])
        w.ok(#"{"op":"update","key":"doc","model":{"id":"X:1","n":2,"by":{"id":"Y:1","name":"y"}}}"#)
        #expect(lists() == [["X:1", "Y:1"], []])
        // Holding the same entity, unchanged: only the holder; changed with it: both.
        w.ok(#"{"op":"update","key":"doc","model":{"id":"X:1","n":21,"by":{"id":"Y:1","name":"y"}}}"#)
        #expect(lists() == [["X:1"], []])
        w.ok(#"{"op":"update","key":"doc","model":{"id":"X:1","n":22,"by":{"id":"Y:1","name":"y2"}}}"#)
        #expect(lists() == [["X:1", "Y:1"], []])
        w.ok(#"{"op":"update","model":{"id":"Y:1","name":"y3"}}"#)
        #expect(lists() == [["X:1", "Y:1"], []])
        w.ok(#"{"op":"update","key":"doc","model":{"id":"X:1","n":3}}"#)
        #expect(lists() == [["X:1"], ["Y:1"]])
        // The entity written on its own (not through the key): the document follows.
        w.ok(#"{"op":"update","model":{"id":"X:1","n":4}}"#)
        #expect(lists() == [["X:1"], []])
        // Deleted and written again in one batch: what it held before is not
        // known from the record, so the trees are compared.
        w.ok(#"{"op":"update","key":"doc","model":{"id":"X:1","n":5,"by":{"id":"Y:2"}}}"#)
        _ = a.take()
        w.ok(#"{"op":"batch","ops":[{"op":"delete","id":"Y:2"},{"op":"update","key":"doc","model":{"id":"X:1","n":6}}]}"#)
        let last = lists()
        #expect(last.first?.contains("X:1") == true && last.last?.contains("Y:2") == true, "\(last)")
    }

    @Test func subscribersComeAndGoWithoutLosingOrDuplicatingEvents() {
        let h = EngineHarness()
        let w = h.connect(), a = h.connect(), b = h.connect()
        w.ok(#"{"op":"update","key":"doc","model":{"n":0}}"#)
        a.ok(#"{"op":"subscribe","sub":"a1","key":"doc"}"#)
        w.ok(#"{"op":"update","key":"doc","model":{"n":1}}"#)
        #expect(a.take().map { $0["model"]?["n"] } == [1])

        // Two, then back to one: the one left is the first or the second.
        b.ok(#"{"op":"subscribe","sub":"b1","key":"doc"}"#)
        w.ok(#"{"op":"update","key":"doc","model":{"n":2}}"#)
        #expect(a.take().map { $0["model"]?["n"] } == [2])
        #expect(b.take().map { $0["model"]?["n"] } == [2])
        a.ok(#"{"op":"unsubscribe","sub":"a1"}"#)
        w.ok(#"{"op":"update","key":"doc","model":{"n":3}}"#)
        #expect(a.take().isEmpty)
        #expect(b.take().map { $0["model"]?["n"] } == [3])

        // Paused alone, then shared while paused, then alone again: one catch-up.
        b.ok(#"{"op":"pause","sub":"b1"}"#)
        w.ok(#"{"op":"update","key":"doc","model":{"n":4}}"#)
        a.ok(#"{"op":"subscribe","sub":"a2","key":"doc"}"#)
        a.ok(#"{"op":"subscribe","sub":"a3","key":"doc"}"#)
        w.ok(#"{"op":"update","key":"doc","model":{"n":5}}"#)
        #expect(a.take().map { $0["model"]?["n"] } == [5, 5])
        #expect(b.take().isEmpty)
        a.ok(#"{"op":"unsubscribe","sub":"a2"}"#)
        a.ok(#"{"op":"unsubscribe","sub":"a3"}"#)
        b.ok(#"{"op":"resume","sub":"b1"}"#)
        #expect(b.take().map { $0["model"]?["n"] } == [5])

        // An ended subscription leaves no pause state behind for a later
        // one (the internal checks look for it after every request).
        b.ok(#"{"op":"pause","sub":"b1"}"#)
        a.ok(#"{"op":"subscribe","sub":"a4","key":"doc"}"#)
        w.ok(#"{"op":"delete","key":"doc"}"#)
        #expect(a.take().map { $0["event"] } == ["delete"])
        #expect(b.take().map { $0["event"] } == ["delete"])
        b.ok(#"{"op":"subscribe","sub":"b1","key":"doc"}"#)
        w.ok(#"{"op":"update","key":"doc","model":{"n":6}}"#)
        #expect(b.take().map { $0["model"]?["n"] } == [6])
        #expect(h.engine.keyViews.count == 1)
        b.close()
        for _ in 0..<10 { h.pumpPublic() }
        #expect(h.engine.keyViews.isEmpty)
    }
}
