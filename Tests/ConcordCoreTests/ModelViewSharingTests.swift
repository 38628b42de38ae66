import ConcordJSON
import Testing

@testable import ConcordCore

/// Model subscriptions whose trees are written alike share one view
/// (`ModelView`, `Engine.modelShares`): each subscriber still gets exactly
/// the events a private tree would give it — paused, resumed, the writer's
/// own, ended, coming and going.
struct ModelViewSharingTests {
    static let tree = #"{"id":"P:1","name":"Ann","friend":{"id":"P:2","name":"Bo"}}"#

    /// The views the engine holds for entity `id`.
    static func views(_ h: EngineHarness, _ id: String) -> Int { h.engine.modelWatchers[id]?.count ?? 0 }

    /// An event without its subscription's name: what two subscribers of one view must agree on.
    static func body(_ e: JSON?) -> String {
        guard case .object(var o)? = e else { return "none" }
        o["sub"] = nil
        var w = JSONWriter()
        w.value(.object(o))
        return String(decoding: w.bytes, as: UTF8.self)
    }

    /// A harness where `a` subscribes `x` and `b` subscribes `y` to
    /// `tree`, and `w` writes.
    static func twoSubscribers() -> (EngineHarness, TestConn, TestConn, TestConn) {
        let h = EngineHarness()
        let a = h.connect(), b = h.connect(), w = h.connect()
        a.ok(#"{"op":"subscribe","sub":"x","model":\#(tree)}"#)
        b.ok(#"{"op":"subscribe","sub":"y","model":\#(tree)}"#)
        return (h, a, b, w)
    }

    @Test func equalTreesShareAViewAndGetTheSameEvents() {
        let (h, a, b, w) = Self.twoSubscribers()
        b.ok(#"{"op":"subscribe","sub":"z","model":\#(Self.tree)}"#)
        #expect(Self.views(h, "P:1") == 1)
        #expect(Self.views(h, "P:2") == 1)
        w.ok(#"{"op":"update","model":{"id":"P:2","name":"Bob"},"context":"c1"}"#)
        let ea = a.take(), eb = b.take()
        #expect(ea.count == 1 && eb.count == 2)
        #expect(ea.first?["sub"] == "x")
        #expect(eb.map { $0["sub"]?.stringValue ?? "" } == ["y", "z"], "one view's subscribers in its order")
        #expect(ea.first?["model"]?["friend"]?["name"] == "Bob")
        #expect(ea.first?["changed"] == json(#"["P:1","P:2"]"#), "P:1 holds P:2")
        #expect(Self.body(ea.first) == Self.body(eb[0]) && Self.body(eb[0]) == Self.body(eb[1]))
        // The update brings a new entity into the tree: every subscriber watches it.
        w.ok(#"{"op":"update","model":{"id":"P:1","name":"Ann","friend":{"id":"P:3","name":"Cy"}}}"#)
        _ = a.take(); _ = b.take()
        w.ok(#"{"op":"update","model":{"id":"P:3","name":"Cyd"}}"#)
        #expect(a.take().first?["model"]?["friend"]?["name"] == "Cyd")
        #expect(b.take().count == 2)
        #expect(Self.views(h, "P:2") == 0 && Self.views(h, "P:3") == 1)
    }

    @Test func treesWrittenDifferentlyDoNotShare() {
        let h = EngineHarness()
        let a = h.connect(), w = h.connect()
        a.ok(#"{"op":"subscribe","sub":"x","model":{"id":"P:1","a":1,"b":2}}"#)
        a.ok(#"{"op":"subscribe","sub":"y","model":{"id":"P:1","b":2,"a":1}}"#)
        a.ok(#"{"op":"subscribe","sub":"z","model":{"id":"P:1","a":1.0,"b":2}}"#)
        a.ok(#"{"op":"subscribe","sub":"v","model":{"id":"P:1","a":1,"b":2}}"#)
        #expect(Self.views(h, "P:1") == 3, "member order and number spelling are part of a tree's bytes")
        w.ok(#"{"op":"update","model":{"id":"P:1","a":5},"mode":"merge"}"#)
        let got = a.take()
        #expect(got.map { $0["sub"]?.stringValue ?? "" } == ["x", "v", "y", "z"], "views in the order they were made")
        #expect(got[0]["model"] == json(#"{"id":"P:1","a":5,"b":2}"#))
        #expect(got[2]["model"] == json(#"{"id":"P:1","b":2,"a":5}"#))
    }

    @Test func aPausedSubscriberCatchesUpFromWhatItWasSent() {
        let (h, a, b, w) = Self.twoSubscribers()
        a.ok(#"{"op":"pause","sub":"x"}"#)
        w.ok(#"{"op":"update","model":{"id":"P:2","name":"Bob"},"context":"c1"}"#)
        w.ok(#"{"op":"update","model":{"id":"P:1","name":"Anne","friend":{"id":"P:2","name":"Bob"}},"context":"c2"}"#)
        #expect(a.take().isEmpty)
        #expect(b.take().count == 2)
        a.ok(#"{"op":"resume","sub":"x"}"#)
        let caught = a.take()
        #expect(caught.count == 1)
        #expect(caught.first?["model"] == json(#"{"id":"P:1","name":"Anne","friend":{"id":"P:2","name":"Bob"}}"#))
        #expect(Set((caught.first?["changed"]?.arrayValue ?? []).compactMap(\.stringValue)) == ["P:1", "P:2"], "everything since what it was sent")
        #expect(caught.first?["context"] == "c2")
        // Running again: the next event is the shared one.
        w.ok(#"{"op":"update","model":{"id":"P:2","name":"B"}}"#)
        #expect(Self.body(a.take().first) == Self.body(b.take().first))
        // Paused through a change and back: nothing owed when the tree is as it was sent.
        a.ok(#"{"op":"pause","sub":"x"}"#)
        w.ok(#"{"op":"update","model":{"id":"P:2","name":"X"}}"#)
        w.ok(#"{"op":"update","model":{"id":"P:2","name":"B"}}"#)
        a.ok(#"{"op":"resume","sub":"x"}"#)
        #expect(a.take().isEmpty)
        #expect(b.take().count == 2)
    }

    @Test func theWritersOwnSubscriptionIsSkippedAndTheOthersAreNot() {
        let (h, a, b, _) = Self.twoSubscribers()
        a.ok(#"{"op":"update","model":{"id":"P:2","name":"Bob"},"origin":"x"}"#)
        #expect(a.take().isEmpty)
        #expect(b.take().first?["model"]?["friend"]?["name"] == "Bob")
        // The writer holds the new tree: the next change is told from there.
        b.ok(#"{"op":"update","model":{"id":"P:1","name":"Al","friend":{"id":"P:2","name":"Bob"}}}"#)
        #expect(a.take().first?["changed"] == json(#"["P:1"]"#))
    }

    @Test func deletingTheRootEndsEverySubscriberAndTheView() {
        let (h, a, b, w) = Self.twoSubscribers()
        b.ok(#"{"op":"pause","sub":"y"}"#)
        weak var view: ModelView?
        view = h.engine.modelWatchers["P:1"]?.values.first
        #expect(view != nil)
        w.ok(#"{"op":"delete","id":"P:1"}"#)
        #expect(a.take().map { $0["event"]?.stringValue ?? "" } == ["delete"])
        #expect(b.take().map { $0["event"]?.stringValue ?? "" } == ["delete"], "a view-ending delete reaches a paused subscriber too")
        #expect(h.engine.modelWatchers.isEmpty && h.engine.modelShares.isEmpty)
        #expect(view == nil, "the view and its subscribers no longer hold each other")
        #expect(a.error(#"{"op":"unsubscribe","sub":"x"}"#) == "no_such_sub")
    }

    @Test func subscribersComeAndGo() {
        let (h, a, b, w) = Self.twoSubscribers()
        weak var view: ModelView?
        view = h.engine.modelWatchers["P:1"]?.values.first
        a.ok(#"{"op":"unsubscribe","sub":"x"}"#)
        w.ok(#"{"op":"update","model":{"id":"P:2","name":"Bob"}}"#)
        #expect(a.take().isEmpty)
        #expect(b.take().count == 1)
        // A newcomer with the tree as it is now joins; one with the old tree does not.
        a.ok(#"{"op":"subscribe","sub":"x","model":{"id":"P:1","name":"Ann","friend":{"id":"P:2","name":"Bob"}}}"#)
        #expect(Self.views(h, "P:1") == 1)
        a.ok(#"{"op":"subscribe","sub":"old","model":\#(Self.tree)}"#)
        #expect(Self.views(h, "P:1") == 2)
        b.close()
        a.close()
        while h.engine.doDeferredWork(units: 1) {}
        #expect(view == nil)
        #expect(h.engine.modelWatchers.isEmpty && h.engine.modelShares.isEmpty)
    }

    @Test func sharingLooksAtABoundedNumberOfTrees() {
        let h = EngineHarness()
        let a = h.connect(), w = h.connect()
        let n = Engine.modelSharesPerRoot + 4
        for i in 0..<n { a.ok(#"{"op":"subscribe","sub":"s\#(i)","model":{"id":"P:1","v":\#(i)}}"#) }
        #expect(h.engine.modelShares["P:1"]?.count == Engine.modelSharesPerRoot)
        #expect(Self.views(h, "P:1") == n)
        // A tree like one not listed gets a view of its own: correct, only not shared.
        a.ok(#"{"op":"subscribe","sub":"late","model":{"id":"P:1","v":\#(n - 1)}}"#)
        #expect(Self.views(h, "P:1") == n + 1)
        w.ok(#"{"op":"update","model":{"id":"P:1","v":-1}}"#)
        #expect(a.take().count == n + 1)
        // Every tree is now alike, and the listed ones are still the first views.
        a.ok(#"{"op":"subscribe","sub":"now","model":{"id":"P:1","v":-1}}"#)
        #expect(Self.views(h, "P:1") == n + 1)
    }

    /// A subscribe compares at most `Engine.modelShareBudget` values
    /// looking for a tree to share: a larger tree gets a view of its own,
    /// and trees that differ only at their end cost the same bounded walk.
    @Test func sharingComparesABoundedNumberOfValues() {
        let h = EngineHarness()
        let a = h.connect(), w = h.connect()
        let big = (0..<Engine.modelShareBudget).map { "\($0)" }.joined(separator: ",")
        let small = (0..<(Engine.modelShareBudget / 3)).map { "\($0)" }.joined(separator: ",")
        a.ok(#"{"op":"subscribe","sub":"b1","model":{"id":"P:1","list":[\#(big)]}}"#)
        a.ok(#"{"op":"subscribe","sub":"b2","model":{"id":"P:1","list":[\#(big)]}}"#)
        #expect(Self.views(h, "P:1") == 2, "past the budget: not shared")
        a.ok(#"{"op":"subscribe","sub":"s1","model":{"id":"P:2","list":[\#(small)]}}"#)
        a.ok(#"{"op":"subscribe","sub":"s2","model":{"id":"P:2","list":[\#(small)]}}"#)
        #expect(Self.views(h, "P:2") == 1, "within it: shared")
        // Three near-copies listed, each a third of the budget to compare:
        // a copy of the third is not found (the budget ends inside it).
        a.ok(#"{"op":"subscribe","sub":"n1","model":{"id":"P:3","list":[\#(small),1]}}"#)
        a.ok(#"{"op":"subscribe","sub":"n2","model":{"id":"P:3","list":[\#(small),2]}}"#)
        a.ok(#"{"op":"subscribe","sub":"n3","model":{"id":"P:3","list":[\#(small),3]}}"#)
        a.ok(#"{"op":"subscribe","sub":"n4","model":{"id":"P:3","list":[\#(small),3]}}"#)
        #expect(Self.views(h, "P:3") == 4, "the budget is spent on the first near-copies")
        func alike(_ x: String, _ y: String, _ budget: Int) -> Bool {
            var b = budget
            return Engine.writtenAlike(json(x), json(y), budget: &b)
        }
        #expect(alike(#"{"a":[1,{"b":2}]}"#, #"{"a":[1,{"b":2}]}"#, 100))
        #expect(!alike(#"{"a":[1,{"b":2}]}"#, #"{"a":[1,{"b":2.0}]}"#, 100))
        #expect(!alike(#"{"a":1,"b":2}"#, #"{"b":2,"a":1}"#, 100))
        #expect(!alike(#"{"a":[1,{"b":2}]}"#, #"{"a":[1,{"b":2}]}"#, 3), "undecided within the budget")
        // Every view still gets its events.
        w.ok(#"{"op":"update","model":{"id":"P:3","list":[]}}"#)
        #expect(a.take().count == 4)
    }

    @Test func clearBreaksTheViewsHold() {
        let (h, a, b, _) = Self.twoSubscribers()
        b.ok(#"{"op":"subscribe","sub":"plain","model":{"no":"entity"}}"#)
        weak var shared: ModelView?, plain: ModelView?
        shared = h.engine.modelWatchers["P:1"]?.values.first
        if case .model(let v)? = h.engine.clients[b.id]?.subs["plain"]?.kind { plain = v }
        #expect(shared != nil && plain != nil)
        a.ok(#"{"op":"clear"}"#)
        #expect(shared == nil && plain == nil)
        #expect(h.engine.modelShares.isEmpty)
    }
}

