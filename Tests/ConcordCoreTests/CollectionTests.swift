import ConcordJSON
import ConcordTestSupport
import Testing

@testable import ConcordCore

struct CollectionTests {
    @Test func insertAppendUpdateRemoveAreSeenBySiblingHolders() throws {
        let h = EngineHarness()
        let a = h.connect()
        let b = h.connect()
        var copyA = a.ok(#"{"op":"subscribe","sub":"c","collection":"feed"}"#)["items"]!.arrayValue!
        var copyB = b.ok(#"{"op":"subscribe","sub":"c","collection":"feed"}"#)["items"]!.arrayValue!
        #expect(copyA.isEmpty)
        let steps = [
            #"{"op":"collection.insert","collection":"feed","items":[{"id":"P:1","t":"a"},{"id":"P:2","t":"b"}]}"#,
            #"{"op":"collection.insert","collection":"feed","index":0,"items":[{"id":"P:0","t":"z"}]}"#,
            #"{"op":"update","model":{"id":"P:1","t":"a2"}}"#,
            #"{"op":"collection.remove","collection":"feed","index":1}"#,
            #"{"op":"collection.insert","collection":"feed","index":2,"items":[{"id":"P:0","t":"z2"}]}"#,
            #"{"op":"collection.remove","collection":"feed","ids":["P:0"]}"#,
            #"{"op":"collection.set","collection":"feed","items":[{"id":"P:2","t":"b"},{"id":"P:3"},{"id":"P:4"}]}"#,
        ]
        for step in steps {
            a.ok(step)
            for e in a.take() { try applyChanges(&copyA, e) }
            let evB = b.take()
            #expect(evB.count == 1, "\(step)")
            for e in evB { try applyChanges(&copyB, e) }
            let server = a.send(#"{"op":"get","collection":"feed"}"#)["items"]!.arrayValue!
            #expect(copyA == server, "\(step)")
            #expect(copyB == server, "\(step)")
        }
        #expect(copyB.map { $0["id"] } == ["P:2", "P:3", "P:4"])
    }

    @Test func updatingARowsChildUpdatesEveryRowSharingIt() throws {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"M:1","by":{"id":"U:1","n":"x"}},{"id":"M:2","by":{"id":"U:2"}},{"id":"M:3","by":{"id":"U:1","n":"x"}}]}"#)
        a.ok(#"{"op":"collection.set","collection":"d","items":[{"id":"M:3","by":{"id":"U:1","n":"x"}}]}"#)
        a.ok(#"{"op":"subscribe","sub":"c","collection":"c"}"#)
        a.ok(#"{"op":"subscribe","sub":"d","collection":"d"}"#)
        a.ok(#"{"op":"update","model":{"id":"U:1","n":"y"}}"#)
        let ev = a.take()
        #expect(ev.count == 2)
        let c = ev.first { $0["sub"] == "c" }!
        // Update changes commute, but their order is fixed: ascending index.
        #expect(c["changes"]?.arrayValue?.compactMap { $0["index"]?.numberValue?.intValue } == [0, 2])
        #expect(c["changes"]?.arrayValue?.allSatisfy { $0["op"] == "update" && $0["item"]?["by"]?["n"] == "y" } == true)
        let d = ev.first { $0["sub"] == "d" }!
        #expect(d["changes"] == json(#"[{"op":"update","index":0,"item":{"id":"M:3","by":{"id":"U:1","n":"y"}}}]"#))
    }

    /// The rows an update rewrites come from a Set; the event lists them by
    /// ascending index whatever that Set's order (it differs per process).
    @Test func updateChangesAreListedByAscendingIndex() throws {
        let h = EngineHarness()
        let a = h.connect()
        let rows = (0..<40).map { #"{"id":"M:\#($0)","by":{"id":"U:1","n":"x"}}"# }.joined(separator: ",")
        a.ok(#"{"op":"collection.set","collection":"c","items":[\#(rows)]}"#)
        a.ok(#"{"op":"subscribe","sub":"c","collection":"c"}"#)
        a.ok(#"{"op":"update","model":{"id":"U:1","n":"y"}}"#)
        a.ok(#"{"op":"update","force":true,"model":{"id":"U:1","n":"y"}}"#)
        let ev = a.take()
        #expect(ev.count == 2)
        for e in ev {
            #expect(e["changes"]?.arrayValue?.compactMap { $0["index"]?.numberValue?.intValue } == Array(0..<40))
        }
    }

    @Test func twoDeletesInABatchAreOneEvent() throws {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"A"},{"id":"B"},{"id":"C"},{"id":"A"}]}"#)
        var copy = a.ok(#"{"op":"subscribe","sub":"c","collection":"c"}"#)["items"]!.arrayValue!
        a.ok(#"{"op":"batch","ops":[{"op":"delete","id":"A"},{"op":"delete","id":"C"}]}"#)
        let ev = a.take()
        #expect(ev.count == 1)
        try applyChanges(&copy, ev[0])
        #expect(copy == [["id": "B"]])
    }

    @Test func requiredMemberDeletionRemovesItemsWhoseParentCascades() throws {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"schema","required":{"Comment":["author"]}}"#)
        a.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"Comment:1","author":{"id":"U:1"}},{"id":"Comment:2","author":{"id":"U:2"}}]}"#)
        var copy = a.ok(#"{"op":"subscribe","sub":"c","collection":"c"}"#)["items"]!.arrayValue!
        a.ok(#"{"op":"delete","id":"U:1"}"#)
        for e in a.take() { try applyChanges(&copy, e) }
        #expect(copy == [json(#"{"id":"Comment:2","author":{"id":"U:2"}}"#)])
    }

    @Test func itemsWrittenByACollectionMutationUpdateEveryOtherView() throws {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"Post:1","t":"old"}}"#)
        a.ok(#"{"op":"collection.insert","collection":"c","items":[{"id":"Post:1","t":"new"}]}"#)
        #expect(a.take().first?["model"]?["t"] == "new")
        #expect(a.send(#"{"op":"get","id":"Post:1"}"#)["model"]?["t"] == "new")
    }

    @Test func errors() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"A"}]}"#)
        #expect(a.error(#"{"op":"collection.insert","collection":"c","index":2,"items":[{"id":"B"}]}"#) == "bad_index")
        #expect(a.error(#"{"op":"collection.insert","collection":"c","index":-1,"items":[{"id":"B"}]}"#) == "bad_index")
        #expect(a.error(#"{"op":"collection.remove","collection":"c","index":1}"#) == "bad_index")
        #expect(a.error(#"{"op":"collection.remove","collection":"c","index":0,"count":2}"#) == "bad_index")
        #expect(a.error(#"{"op":"collection.remove","collection":"nope","index":0}"#) == "bad_index")
        #expect(a.error(#"{"op":"collection.insert","collection":"c","items":[{"id":"B"},{"name":"x"}]}"#) == "not_entity")
        #expect(a.error(#"{"op":"collection.set","collection":"c","items":[1]}"#) == "not_entity")
        #expect(a.error(#"{"op":"collection.set","collection":"c"}"#) == "bad_request")
        // A failing op in a batch rolls back the ops before it.
        let r = a.send(#"{"op":"batch","ops":[{"op":"collection.insert","collection":"c","items":[{"id":"B"}]},{"op":"collection.remove","collection":"c","index":5}]}"#)
        #expect(r["error"]?["code"] == "bad_index")
        #expect(r["error"]?["message"]?.stringValue?.hasPrefix("ops[1]") == true)
        #expect(a.send(#"{"op":"get","collection":"c"}"#)["items"] == [["id": "A"]])
        #expect(a.send(#"{"op":"get","id":"B"}"#)["model"] == .null)
        // Batch ops are checked against the state earlier ops leave.
        a.ok(#"{"op":"batch","ops":[{"op":"collection.insert","collection":"c","items":[{"id":"B"}]},{"op":"collection.remove","collection":"c","index":1}]}"#)
    }

    @Test func deleteAndClearEndSubscriptionsAndMissingCollectionsAreEmpty() {
        let h = EngineHarness()
        let a = h.connect()
        #expect(a.ok(#"{"op":"get","collection":"none"}"#)["items"] == [])
        a.ok(#"{"op":"subscribe","sub":"c","collection":"c"}"#)
        a.ok(#"{"op":"collection.set","collection":"c","items":[]}"#)
        #expect(a.send(#"{"op":"stats"}"#)["collections"] == 1)
        a.ok(#"{"op":"collection.delete","collection":"c"}"#)
        #expect(a.take().map { $0["event"] } == ["delete"])
        #expect(a.send(#"{"op":"stats"}"#)["collections"] == 0)
        // Removed by one op and re-created by a later one: the view still ends.
        a.ok(#"{"op":"subscribe","sub":"c","collection":"c"}"#)
        a.ok(#"{"op":"batch","ops":[{"op":"collection.delete","collection":"c"},{"op":"collection.insert","collection":"c","items":[{"id":"X"}]}]}"#)
        #expect(a.take().map { $0["event"] } == ["delete"])
        #expect(a.send(#"{"op":"get","collection":"c"}"#)["items"] == [["id": "X"]])
    }

    @Test func pauseResumeSendsOneResetOrNothing() throws {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"A","v":1}]}"#)
        var copy = a.ok(#"{"op":"subscribe","sub":"c","collection":"c"}"#)["items"]!.arrayValue!
        a.ok(#"{"op":"pause","sub":"c"}"#)
        a.ok(#"{"op":"collection.insert","collection":"c","items":[{"id":"B"}],"context":"k1"}"#)
        a.ok(#"{"op":"update","model":{"id":"A","v":2},"context":"k2"}"#)
        #expect(a.take().isEmpty)
        a.ok(#"{"op":"resume","sub":"c"}"#)
        let ev = a.take()
        #expect(ev.count == 1)
        #expect(ev.first?["context"] == "k2")
        try applyChanges(&copy, ev[0])
        #expect(copy == a.send(#"{"op":"get","collection":"c"}"#)["items"]!.arrayValue!)
        a.ok(#"{"op":"pause","sub":"c"}"#)
        a.ok(#"{"op":"collection.insert","collection":"c","items":[{"id":"C"}]}"#)
        a.ok(#"{"op":"collection.remove","collection":"c","ids":["C"]}"#)
        a.ok(#"{"op":"resume","sub":"c"}"#)
        #expect(a.take().isEmpty)
    }

    @Test func originWriterIsNotTold() {
        let h = EngineHarness()
        let a = h.connect()
        let b = h.connect()
        a.ok(#"{"op":"subscribe","sub":"mine","collection":"c"}"#)
        b.ok(#"{"op":"subscribe","sub":"theirs","collection":"c"}"#)
        a.ok(#"{"op":"collection.insert","collection":"c","items":[{"id":"A"}],"origin":"mine"}"#)
        #expect(a.take().isEmpty)
        #expect(b.take().count == 1)
    }

    @Test func oneItemUpdateInALargeCollectionSendsOneChange() throws {
        let h = EngineHarness()
        let a = h.connect()
        let items = (0..<100_000).map { #"{"id":"I:\#($0)","n":\#($0)}"# }.joined(separator: ",")
        a.ok(#"{"op":"collection.set","collection":"big","items":[\#(items)]}"#)
        a.ok(#"{"op":"subscribe","sub":"c","collection":"big"}"#)
        a.ok(#"{"op":"update","model":{"id":"I:77777","n":-1}}"#)
        let ev = a.take()
        #expect(ev.count == 1)
        #expect(ev.first?["changes"] == json(#"[{"op":"update","index":77777,"item":{"id":"I:77777","n":-1}}]"#))
        a.ok(#"{"op":"collection.insert","collection":"big","index":0,"items":[{"id":"I:new"}]}"#)
        #expect(a.take().first?["changes"] == json(#"[{"op":"insert","index":0,"items":[{"id":"I:new"}]}]"#))
        a.ok(#"{"op":"collection.remove","collection":"big","index":0}"#)
        #expect(a.take().first?["changes"] == json(#"[{"op":"remove","index":0,"count":1}]"#))
    }

    @Test func setIsExpressedAsTheChangedMiddle() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"A"},{"id":"B"},{"id":"C"}]}"#)
        a.ok(#"{"op":"subscribe","sub":"c","collection":"c"}"#)
        a.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"A"},{"id":"X"},{"id":"C"},{"id":"D"}]}"#)
        #expect(a.take().first?["changes"] == json(#"[{"op":"remove","index":1,"count":2},{"op":"insert","index":1,"items":[{"id":"X"},{"id":"C"},{"id":"D"}]}]"#))
        a.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"A"},{"id":"X"},{"id":"C"},{"id":"D"},{"id":"E"}]}"#)
        #expect(a.take().first?["changes"] == json(#"[{"op":"insert","index":4,"items":[{"id":"E"}]}]"#))
        a.ok(#"{"op":"collection.set","collection":"c","items":[{"id":"X"},{"id":"C"},{"id":"D"},{"id":"E","v":1}]}"#)
        #expect(a.take().first?["changes"] == json(#"[{"op":"update","index":4,"item":{"id":"E","v":1}},{"op":"remove","index":0,"count":1}]"#))
    }

    /// "previous ⊕ changes = current" for random single-connection sequences,
    /// batches and pauses included, with entity updates and deletes touching items.
    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func changesAlwaysComposeToTheServersList(seed: UInt64) throws {
        var rng = SeededRandom(seed: seed)
        let h = EngineHarness()
        let w = h.connect()
        let r = h.connect()
        w.ok(#"{"op":"schema","required":{"C":["p"]}}"#)
        var copies: [String: [JSON]] = [:]
        var paused: Set<String> = []
        for name in ["x", "y"] { copies[name] = r.ok(#"{"op":"subscribe","sub":"\#(name)","collection":"\#(name)"}"#)["items"]!.arrayValue! }
        func item() -> String {
            let i = Int.random(in: 0..<12, using: &rng)
            if i < 4 { return #"{"id":"C:\#(i)","p":{"id":"P:\#(Int.random(in: 0..<3, using: &rng))","v":\#(Int.random(in: 0..<3, using: &rng))}}"# }
            return #"{"id":"E:\#(i)","v":\#(Int.random(in: 0..<4, using: &rng))}"#
        }
        func op(_ name: String) -> String {
            let count = w.send(#"{"op":"get","collection":"\#(name)"}"#)["items"]!.arrayValue!.count
            switch Int.random(in: 0..<10, using: &rng) {
            case 0: return #"{"op":"collection.set","collection":"\#(name)","items":[\#(item()),\#(item()),\#(item())]}"#
            case 1, 2: return #"{"op":"collection.insert","collection":"\#(name)","index":\#(Int.random(in: 0...count, using: &rng)),"items":[\#(item())]}"#
            case 3: return #"{"op":"collection.insert","collection":"\#(name)","items":[\#(item()),\#(item())]}"#
            case 4 where count > 0: return #"{"op":"collection.remove","collection":"\#(name)","index":\#(Int.random(in: 0..<count, using: &rng))}"#
            case 5: return #"{"op":"collection.remove","collection":"\#(name)","ids":["E:\#(Int.random(in: 4..<12, using: &rng))"]}"#
            case 6: return #"{"op":"update","model":\#(item())}"#
            case 7: return #"{"op":"delete","id":"P:\#(Int.random(in: 0..<3, using: &rng))"}"#
            case 8: return #"{"op":"delete","id":"E:\#(Int.random(in: 4..<12, using: &rng))"}"#
            default: return #"{"op":"update","model":{"id":"P:\#(Int.random(in: 0..<3, using: &rng))","v":\#(Int.random(in: 0..<9, using: &rng))}}"#
            }
        }
        for _ in 0..<400 {
            let name = Bool.random(using: &rng) ? "x" : "y"
            let roll = Int.random(in: 0..<10, using: &rng)
            if roll == 0 {
                let o = paused.contains(name) ? "resume" : "pause"
                r.ok(#"{"op":"\#(o)","sub":"\#(name)"}"#)
                if o == "pause" { paused.insert(name) } else { paused.remove(name) }
            } else if roll == 1 {
                // Batches are validated against state; build from ops valid now and tolerate refusals.
                _ = w.send(#"{"op":"batch","ops":[\#(op(name)),\#(op(name == "x" ? "y" : "x")),\#(op(name))]}"#)
            } else {
                _ = w.send(op(name))
            }
            for e in r.take() {
                let sub = e["sub"]!.stringValue!
                #expect(e["event"] == "collection")
                try applyChanges(&copies[sub, default: []], e)
            }
            for n in ["x", "y"] where !paused.contains(n) {
                let server = w.send(#"{"op":"get","collection":"\#(n)"}"#)["items"]!.arrayValue!
                #expect(copies[n]! == server, "seed \(seed) collection \(n)")
                if copies[n]! != server { return }
            }
        }
    }
}
