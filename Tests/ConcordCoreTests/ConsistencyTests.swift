import ConcordJSON
import Testing

@testable import ConcordCore

/// Ports of the ConsistencyManager / RocketData reference scenarios to the wire protocol.
struct ConsistencyTests {
    @Test func childSwapAtAnyDepthAndEveryOccurrence() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"Feed:1","posts":[{"id":"Post:1","author":{"id":"Person:1","name":"Ann"}},{"id":"Post:2","meta":{"by":{"id":"Person:1","name":"Ann"}}}],"owner":{"id":"Person:1","name":"Ann"}}}"#)
        a.ok(#"{"op":"update","model":{"id":"Person:1","name":"Bea"}}"#)
        let ev = a.take()
        #expect(ev.count == 1)
        let m = ev[0]["model"]!
        #expect(m["posts"]?.arrayValue?[0]["author"]?["name"] == "Bea")
        #expect(m["posts"]?.arrayValue?[1]["meta"]?["by"]?["name"] == "Bea")
        #expect(m["owner"]?["name"] == "Bea")
        #expect(ev[0]["changed"] == ["Feed:1", "Post:1", "Person:1", "Post:2"])
        #expect(ev[0]["deleted"] == [])
        #expect(ev[0]["seq"] == 1)
    }

    @Test func identitiesBroughtByAnUpdateAreWatched() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"Post:1","author":{"id":"Person:1"}}}"#)
        a.ok(#"{"op":"update","model":{"id":"Person:1","best":{"id":"Person:2","name":"Zed"}}}"#)
        #expect(a.take().count == 1)
        a.ok(#"{"op":"update","model":{"id":"Person:2","name":"Zoe"}}"#)
        let ev = a.take()
        #expect(ev.count == 1)
        #expect(ev.first?["model"]?["author"]?["best"]?["name"] == "Zoe")
        #expect(ev.first?["changed"] == ["Post:1", "Person:1", "Person:2"])
    }

    @Test func removedSubModelsStopNotifying() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"Post:1","author":{"id":"Person:1","best":{"id":"Person:2"}}}}"#)
        a.ok(#"{"op":"update","model":{"id":"Person:1","name":"solo"}}"#)
        let ev = a.take()
        #expect(ev.first?["deleted"] == ["Person:2"])
        a.ok(#"{"op":"update","model":{"id":"Person:2","name":"gone"}}"#)
        #expect(a.take().isEmpty)
    }

    @Test func equalUpdateSendsNothingUnlessForced() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"P:1","n":1.0}}"#)
        a.ok(#"{"op":"update","model":{"id":"P:1","n":1}}"#)  // numbers by value
        #expect(a.take().isEmpty)
        a.ok(#"{"op":"update","model":{"id":"P:1","n":1},"force":true}"#)
        let ev = a.take()
        #expect(ev.count == 1)
        #expect(ev.first?["changed"] == [])
    }

    @Test func deletingAnOptionalMemberNullsItAndRemovesArrayElements() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"Post:1","author":{"id":"Person:1"},"likes":[{"id":"Person:1"},{"id":"Person:2"}],"meta":{"by":{"id":"Person:1"}}}}"#)
        a.ok(#"{"op":"delete","id":"Person:1"}"#)
        let ev = a.take()
        #expect(ev.count == 1)
        let m = ev[0]["model"]!
        #expect(m["author"] == .null)
        #expect(m["likes"] == [["id": "Person:2"]])
        #expect(m["meta"]?["by"] == .null)
        #expect(ev[0]["deleted"] == ["Person:1"])
    }

    @Test func deletingARequiredMemberCascadesToTheRootAndOutOfArrays() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"schema","required":{"Message":["sender"]}}"#)
        a.ok(#"{"op":"update","key":"inbox","model":{"id":"Inbox:1","messages":[{"id":"Message:1","sender":{"id":"Person:1"}},{"id":"Message:2","sender":{"id":"Person:2"}}]}}"#)
        a.ok(#"{"op":"subscribe","sub":"root","model":{"id":"Message:1","sender":{"id":"Person:1"}}}"#)
        a.ok(#"{"op":"subscribe","sub":"inbox","key":"inbox"}"#)
        a.ok(#"{"op":"subscribe","sub":"ids","ids":["Message:1","Person:2"]}"#)
        let r = a.ok(#"{"op":"delete","id":"Person:1"}"#)
        let ev = a.take()
        let bySub = Dictionary(grouping: ev, by: { $0["sub"]!.stringValue! })
        #expect(bySub["root"]?.first?["event"] == "delete")
        #expect(bySub["inbox"]?.first?["model"]?["messages"] == [["id": "Message:2", "sender": ["id": "Person:2"]]])
        #expect(bySub["ids"]?.count == 1)
        #expect(bySub["ids"]?.first?["id"] == "Message:1")
        #expect(bySub["ids"]?.first?["model"] == .null)
        #expect(ev.allSatisfy { $0["seq"] == r["seq"] })
        // The name is free again.
        a.ok(#"{"op":"subscribe","sub":"root","model":{"id":"X:1"}}"#)
        #expect(a.send(#"{"op":"get","id":"Message:1"}"#)["model"] == .null)
    }

    @Test func mergeKeepsMembersTheUpdateLacks() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","model":{"id":"P:1","name":"Ann","age":30,"pet":{"id":"Pet:1","kind":"cat","name":"Tom"}}}"#)
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"Post:1","by":{"id":"P:1","name":"Ann","age":30,"pet":{"id":"Pet:1","kind":"cat","name":"Tom"}}}}"#)
        a.ok(#"{"op":"update","mode":"merge","model":{"id":"P:1","age":31,"pet":{"id":"Pet:1","name":"Tim"}}}"#)
        let m = a.take().first?["model"]
        #expect(m?["by"] == json(#"{"id":"P:1","name":"Ann","age":31,"pet":{"id":"Pet:1","kind":"cat","name":"Tim"}}"#))
        let stored = a.send(#"{"op":"get","id":"P:1"}"#)["model"]
        #expect(stored == json(#"{"id":"P:1","name":"Ann","age":31,"pet":{"id":"Pet:1","kind":"cat","name":"Tim"}}"#))
    }

    @Test func mergeThatWouldCreateACycleIsRejected() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","model":{"id":"A","b":{"id":"B"}}}"#)
        #expect(a.error(#"{"op":"update","mode":"merge","model":{"id":"B","a":{"id":"A"}}}"#) == "bad_request")
        #expect(a.send(#"{"op":"ping"}"#)["seq"] == 1)
    }

    /// The cycle search is skipped when every edge a merge gains leads to an
    /// entity that holds none; these are cases where it must not be. (An
    /// identity repeated within one request is one value, the last one
    /// written: no cycle is stored that way.)
    @Test func mergeCyclesThroughStoredChainsAreRejected() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","model":{"id":"A","b":{"id":"B","c":{"id":"C"}}}}"#)
        // C gains an edge to A, which holds B, which holds C.
        #expect(a.error(#"{"op":"update","mode":"merge","model":{"id":"C","a":{"id":"A"}}}"#) == "bad_request")
        // B gains an edge to A, which holds B (A's merged value keeps it).
        #expect(a.error(#"{"op":"update","mode":"merge","model":{"id":"B","up":{"id":"A","n":1}}}"#) == "bad_request")
        #expect(a.send(#"{"op":"ping"}"#)["seq"] == 1)
        // Gaining an edge to an entity that holds others is no cycle when
        // they do not lead back; to one that holds none, neither.
        a.ok(#"{"op":"update","mode":"merge","model":{"id":"D","a":{"id":"A"}}}"#)
        a.ok(#"{"op":"update","mode":"merge","model":{"id":"C","leaf":{"id":"L","name":"l"}}}"#)
        #expect(a.send(#"{"op":"get","id":"D"}"#)["model"] == json(#"{"id":"D","a":{"id":"A","b":{"id":"B","c":{"id":"C","leaf":{"id":"L","name":"l"}}}}}"#))
    }

    @Test func batchSendsAtMostOneEventPerView() {
        let h = EngineHarness()
        let a = h.connect()
        let b = h.connect()
        b.ok(#"{"op":"subscribe","sub":"m","model":{"id":"P:1","f":{"id":"P:2"}}}"#)
        b.ok(#"{"op":"subscribe","sub":"ids","ids":["P:1","P:2"]}"#)
        b.ok(#"{"op":"subscribe","sub":"feed","feed":{}}"#)
        let r = a.ok(#"{"op":"batch","context":"ctx","ops":[{"op":"update","model":{"id":"P:1","x":1,"f":{"id":"P:2"}}},{"op":"update","model":{"id":"P:2","y":2}},{"op":"update","model":{"id":"P:1","x":2,"f":{"id":"P:2","y":3}}}]}"#)
        #expect(r["seq"] == 1)
        let ev = b.take()
        let model = ev.filter { $0["sub"] == "m" }
        #expect(model.count == 1)
        #expect(model.first?["model"] == json(#"{"id":"P:1","x":2,"f":{"id":"P:2","y":3}}"#))
        #expect(ev.filter { $0["sub"] == "ids" }.count == 2)
        #expect(ev.filter { $0["sub"] == "feed" }.count == 2)
        #expect(ev.allSatisfy { $0["context"] == "ctx" && $0["seq"] == 1 })
    }

    @Test func invalidBatchOpAppliesNothing() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"f","feed":{}}"#)
        let r = a.send(#"{"op":"batch","ops":[{"op":"update","model":{"id":"A","v":1}},{"op":"update"}]}"#)
        #expect(r["error"]?["code"] == "bad_request")
        #expect(r["error"]?["message"]?.stringValue?.hasPrefix("ops[1]") == true)
        #expect(a.send(#"{"op":"get","id":"A"}"#)["model"] == .null)
        #expect(a.send(#"{"op":"ping"}"#)["seq"] == 0)
        #expect(a.take().isEmpty)
        #expect(a.error(#"{"op":"batch","ops":[{"op":"ping"}]}"#) == "bad_request")
        #expect(a.error(#"{"op":"batch","ops":[{"op":"nope"}]}"#) == "unknown_op")
        #expect(a.error(#"{"op":"batch","ops":[{"op":"update","rid":1,"model":{"id":"A"}}]}"#) == "bad_request")
    }

    @Test func contextIsDeliveredAndAbsentWhenNotGiven() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"A"}}"#)
        a.ok(#"{"op":"update","model":{"id":"A","v":1},"context":{"why":["x",1]}}"#)
        #expect(a.take().first?["context"] == ["why": ["x", 1]])
        a.ok(#"{"op":"update","model":{"id":"A","v":2}}"#)
        #expect(a.take().first?["context"] == nil)
    }

    @Test func pauseResumeCoalescesAndCancelledChangesSendNothing() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","key":"k","model":{"id":"A","v":0}}"#)
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"A","v":0}}"#)
        a.ok(#"{"op":"subscribe","sub":"k","key":"k"}"#)
        a.ok(#"{"op":"subscribe","sub":"i","ids":["A"]}"#)
        for s in ["m", "k", "i"] { a.ok(#"{"op":"pause","sub":"\#(s)"}"#) }
        a.ok(#"{"op":"update","model":{"id":"A","v":1},"context":"c1"}"#)
        a.ok(#"{"op":"update","model":{"id":"A","v":2},"context":"c2"}"#)
        #expect(a.take().isEmpty)
        for s in ["m", "k", "i"] {
            a.ok(#"{"op":"resume","sub":"\#(s)"}"#)
            let ev = a.take()
            #expect(ev.count == 1)
            #expect(ev.first?["model"]?["v"] == 2)
            #expect(ev.first?["context"] == "c2")
            #expect(ev.first?["seq"] == 3)
        }
        for s in ["m", "k", "i"] { a.ok(#"{"op":"pause","sub":"\#(s)"}"#) }
        a.ok(#"{"op":"update","model":{"id":"A","v":3}}"#)
        a.ok(#"{"op":"update","model":{"id":"A","v":2}}"#)
        for s in ["m", "k", "i"] { a.ok(#"{"op":"resume","sub":"\#(s)"}"#) }
        #expect(a.take().isEmpty)
    }

    @Test func viewEndingDeleteReachesPausedAndOriginSubscriptions() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"A"}}"#)
        a.ok(#"{"op":"pause","sub":"m"}"#)
        a.ok(#"{"op":"delete","id":"A","origin":"m"}"#)
        #expect(a.take().map { $0["event"] } == ["delete"])
    }

    @Test func idsWatchEntitiesBeforeTheyExist() {
        let h = EngineHarness()
        let a = h.connect()
        let r = a.ok(#"{"op":"subscribe","sub":"i","ids":["Person:9", 12]}"#)
        #expect(r["models"] == ["Person:9": .null, "12": .null])
        a.ok(#"{"op":"update","model":{"id":"Group:1","members":[{"id":12,"n":"twelve"}]}}"#)
        let ev = a.take()
        #expect(ev.count == 1)
        #expect(ev.first?["id"] == "12")
        #expect(ev.first?["model"] == ["id": 12, "n": "twelve"])
        // A nested change reaches the watcher of the parent.
        a.ok(#"{"op":"update","model":{"id":"Person:9","friend":{"id":"Person:10","n":1}}}"#)
        _ = a.take()
        a.ok(#"{"op":"update","model":{"id":"Person:10","n":2}}"#)
        #expect(a.take().map { $0["id"] } == ["Person:9"])
    }

    @Test func feedFiltersByType() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"f","feed":{"types":["Person"]}}"#)
        a.ok(#"{"op":"update","model":{"id":"Post:1","by":{"id":"Person:1","n":1}}}"#)
        let ev = a.take()
        #expect(ev.map { $0["id"] } == ["Person:1"])
        // Own record unchanged, nested change only: not a feed event for Post.
        a.ok(#"{"op":"subscribe","sub":"all","feed":{}}"#)
        a.ok(#"{"op":"update","model":{"id":"Person:1","n":2}}"#)
        #expect(a.take().map { $0["id"] }.sorted { $0!.stringValue! < $1!.stringValue! } == ["Person:1", "Person:1"])
    }

    @Test func originSubscriptionIsRewrittenButNotTold() {
        let h = EngineHarness()
        let a = h.connect()
        let b = h.connect()
        a.ok(#"{"op":"subscribe","sub":"mine","model":{"id":"A","v":0}}"#)
        b.ok(#"{"op":"subscribe","sub":"theirs","model":{"id":"A","v":0}}"#)
        a.ok(#"{"op":"update","model":{"id":"A","v":1},"origin":"mine"}"#)
        #expect(a.take().isEmpty)
        #expect(b.take().count == 1)
        a.ok(#"{"op":"update","model":{"id":"A","v":2}}"#)
        let ev = a.take()
        #expect(ev.first?["changed"] == ["A"])
        #expect(ev.first?["model"] == ["id": "A", "v": 2])
        #expect(a.error(#"{"op":"update","model":{"id":"A"},"origin":"nope"}"#) == "no_such_sub")
    }

    /// §4 batch: each op's own `origin` is honoured like the batch's, and an
    /// op naming a subscription the sender does not have refuses the whole
    /// batch with a message starting `ops[i]`, applying nothing.
    @Test func eachOpsOwnOriginInABatchIsHonouredAndChecked() {
        let h = EngineHarness()
        let a = h.connect()
        let b = h.connect()
        a.ok(#"{"op":"subscribe","sub":"mine","model":{"id":"A","v":0}}"#)
        a.ok(#"{"op":"subscribe","sub":"other","model":{"id":"B","v":0}}"#)
        b.ok(#"{"op":"subscribe","sub":"theirs","model":{"id":"A","v":0}}"#)
        a.ok(#"{"op":"batch","ops":[{"op":"update","model":{"id":"A","v":1},"origin":"mine"},{"op":"update","model":{"id":"B","v":1}}]}"#)
        // The writer's own view of A is told nothing; its view of B is.
        #expect(a.take().map { $0["sub"] } == ["other"])
        #expect(b.take().map { $0["model"]?["v"] } == [1])
        let r = a.send(#"{"op":"batch","ops":[{"op":"update","model":{"id":"A","v":2}},{"op":"update","model":{"id":"B","v":2},"origin":"nope"}]}"#)
        #expect(r["error"]?["code"] == "no_such_sub")
        #expect(r["error"]?["message"]?.stringValue?.hasPrefix("ops[1]: origin 'nope'") == true)
        #expect(a.take().isEmpty && b.take().isEmpty)
        #expect(a.send(#"{"op":"get","id":"A"}"#)["model"]?["v"] == 1)
    }

    @Test func keyDocumentsStayCurrentAndEndOnDelete() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"k","key":"home"}"#)
        a.ok(#"{"op":"update","key":"home","model":{"title":"x","top":{"id":"Post:1","t":"a"}}}"#)
        #expect(a.take().first?["changed"] == ["Post:1"])
        a.ok(#"{"op":"update","model":{"id":"Post:1","t":"b"}}"#)
        #expect(a.take().first?["model"]?["top"]?["t"] == "b")
        #expect(a.send(#"{"op":"get","key":"home"}"#)["model"]?["top"]?["t"] == "b")
        a.ok(#"{"op":"delete","key":"home"}"#)
        #expect(a.take().map { $0["event"] } == ["delete"])
        #expect(a.send(#"{"op":"get","key":"home"}"#)["model"] == .null)
        #expect(a.send(#"{"op":"get","id":"Post:1"}"#)["model"]?["t"] == "b")
    }

    @Test func keySubscribersShareOnePayload() {
        let h = EngineHarness()
        let conns = (0..<5).map { _ in h.connect() }
        for (i, c) in conns.enumerated() { c.ok(#"{"op":"subscribe","sub":"s\#(i)","key":"k"}"#) }
        conns[0].ok(#"{"op":"update","key":"k","model":{"id":"A","v":1}}"#)
        for (i, c) in conns.enumerated() {
            let ev = c.take()
            #expect(ev.count == 1)
            #expect(ev.first?["sub"] == .string("s\(i)"))
        }
    }

    @Test func refreshReplacesKnownEntities() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","model":{"id":"A","v":2}}"#)
        let r = a.ok(#"{"op":"subscribe","sub":"m","refresh":true,"model":{"list":[{"id":"A","v":1},{"id":"B","v":1}]}}"#)
        #expect(r["model"] == json(#"{"list":[{"id":"A","v":2},{"id":"B","v":1}]}"#))
        let plain = a.ok(#"{"op":"subscribe","sub":"n","model":{"id":"A","v":1}}"#)
        #expect(plain["model"] == ["id": "A", "v": 1])
        #expect(a.send(#"{"op":"get","id":"B"}"#)["model"] == .null)
    }

    @Test func clearEndsEverySubscriptionEverywhere() {
        let h = EngineHarness()
        let a = h.connect()
        let b = h.connect()
        a.ok(#"{"op":"schema","required":{"M":["s"]}}"#)
        a.ok(#"{"op":"update","model":{"id":"A"},"key":"k"}"#)
        b.ok(#"{"op":"subscribe","sub":"x","key":"k"}"#)
        b.ok(#"{"op":"subscribe","sub":"y","feed":{}}"#)
        let r = a.ok(#"{"op":"clear","context":1}"#)
        #expect(r["seq"] == 2)
        #expect(b.take().map { $0["event"] } == ["delete", "delete"])
        #expect(a.send(#"{"op":"stats"}"#)["subscriptions"] == 0)
        #expect(a.send(#"{"op":"get","id":"A"}"#)["model"] == .null)
        #expect(a.send(#"{"op":"schema"}"#)["required"] == ["M": ["s"]])
    }

    @Test func closingAConnectionLeavesNothingBehind() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"A"}}"#)
        a.ok(#"{"op":"subscribe","sub":"k","key":"k"}"#)
        a.ok(#"{"op":"subscribe","sub":"i","ids":["A"]}"#)
        a.ok(#"{"op":"subscribe","sub":"f","feed":{}}"#)
        a.close()
        // The connection is gone at once; its subscriptions end as deferred
        // work, a slice at a time, between turns.
        #expect(h.engine.connectionCount == 0)
        #expect(h.engine.hasDeferredWork)
        var slices = 0
        while h.engine.doDeferredWork(units: 1) { slices += 1 }
        #expect(slices >= 3)
        #expect(h.engine.subscriptionCount == 0)
        #expect(h.engine.modelWatchers.isEmpty)
        #expect(h.engine.keyViews.isEmpty)
        #expect(h.engine.idWatchers.isEmpty)
        #expect(h.engine.feeds.isEmpty)
    }

    @Test func flatteningLastOccurrenceWins() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","model":{"id":"A","x":{"id":"B","v":1},"y":{"id":"B","v":2}}}"#)
        #expect(a.send(#"{"op":"get","id":"A"}"#)["model"] == json(#"{"id":"A","x":{"id":"B","v":2},"y":{"id":"B","v":2}}"#))
        #expect(a.send(#"{"op":"get","id":"B"}"#)["model"] == ["id": "B", "v": 2])
    }
}
