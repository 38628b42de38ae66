import ConcordJSON
import ConcordTestSupport
import Synchronization
import Testing

@testable import ConcordCore

/// Conditional mutations, tokens, `since`, `sync` and `min_seq`
/// (PROTOCOL.md §3.2, §4.1, §8.3 on a single server).
struct ConditionalTests {
    @Test func aWriteBasedOnAStaleReadConflictsAndChangesNothing() {
        let h = EngineHarness()
        let a = h.connect(), b = h.connect()
        let read = a.ok(#"{"op":"update","model":{"id":"P:1","n":1,"tag":{"id":"T:1","s":"x"}}}"#)["seq"]!.numberValue!.intValue!
        // Another process changes the nested entity.
        b.ok(#"{"op":"update","model":{"id":"T:1","s":"y"}}"#)
        let r = a.send(#"{"op":"update","if_unchanged_since":\#(read),"model":{"id":"P:1","n":2,"tag":{"id":"T:1","s":"x"}}}"#)
        #expect(r["error"]?["code"] == "conflict")
        #expect(r["error"]?["seq"] == 2)
        #expect(r["error"]?["conflicts"] == json(#"{"entities":["T:1"],"keys":[],"collections":[]}"#))
        #expect(a.send(#"{"op":"get","id":"P:1"}"#)["model"]?["n"] == 1)
        #expect(a.send(#"{"op":"ping"}"#)["seq"] == 2)
        // Based on the current seq it applies.
        #expect(a.ok(#"{"op":"update","if_unchanged_since":2,"model":{"id":"P:1","n":2,"tag":{"id":"T:1","s":"y"}}}"#)["seq"] == 3)
        // In the future: bad_request.
        #expect(a.error(#"{"op":"update","if_unchanged_since":99,"model":{"id":"P:1"}}"#) == "bad_request")
        #expect(a.error(#"{"op":"update","if_unchanged_since":-1,"model":{"id":"P:1"}}"#) == "bad_request")
    }

    @Test func zeroMeansNeverWrittenAndADeleteCountsAsAChange() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","if_unchanged_since":0,"model":{"id":"New:1"}}"#)
        #expect(a.error(#"{"op":"update","if_unchanged_since":0,"model":{"id":"New:1","x":1}}"#) == "conflict")
        a.ok(#"{"op":"delete","id":"New:1"}"#)  // seq 2
        let r = a.send(#"{"op":"update","if_unchanged_since":1,"model":{"id":"New:1"}}"#)
        #expect(r["error"]?["code"] == "conflict")
        #expect(r["error"]?["seq"] == 2)
        a.ok(#"{"op":"update","if_unchanged_since":2,"model":{"id":"New:1"}}"#)
    }

    @Test func keysCollectionsAndBatchesAsOne() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","key":"home","model":{"title":"a"}}"#)              // 1
        a.ok(#"{"op":"collection.insert","collection":"feed","items":[{"id":"I:1"}]}"#)  // 2
        a.ok(#"{"op":"update","model":{"id":"X:1"}}"#)                              // 3
        // The batch touches the key (changed at 1) and X:1 (at 3): both listed, nothing applied.
        let r = a.send(#"{"op":"batch","if_unchanged_since":1,"ops":[{"op":"update","key":"home","model":{"title":"b"}},{"op":"update","model":{"id":"X:1","v":1}},{"op":"collection.remove","collection":"feed","index":0}]}"#)
        #expect(r["error"]?["code"] == "conflict")
        #expect(r["error"]?["seq"] == 3)
        #expect(r["error"]?["conflicts"] == json(#"{"entities":["X:1"],"keys":[],"collections":["feed"]}"#))
        #expect(a.send(#"{"op":"get","key":"home"}"#)["model"]?["title"] == "a")
        a.ok(#"{"op":"batch","if_unchanged_since":3,"ops":[{"op":"update","key":"home","model":{"title":"b"}},{"op":"collection.remove","collection":"feed","index":0}]}"#)
        // A write set changed only as a consequence (a holder) is not a conflict.
        a.ok(#"{"op":"update","model":{"id":"H:1","child":{"id":"C:1","v":1}}}"#)  // 5
        a.ok(#"{"op":"update","model":{"id":"C:1","v":2}}"#)                      // 6
        a.ok(#"{"op":"update","mode":"merge","if_unchanged_since":5,"model":{"id":"H:1","x":1}}"#)
        // A conditional delete: of an entity written since, a conflict; else applied.
        #expect(a.error(#"{"op":"delete","id":"C:1","if_unchanged_since":5}"#) == "conflict")
        #expect(a.error(#"{"op":"delete","key":"home","if_unchanged_since":3}"#) == "conflict")
        a.ok(#"{"op":"delete","key":"home","if_unchanged_since":4}"#)
        #expect(a.error(#"{"op":"update","if_unchanged_since":5,"model":{"id":"H:1","child":{"id":"C:1","v":2}}}"#) == "conflict")
    }

    @Test func aRetryWithTheSameTokenIsAnsweredNotAppliedAgain() {
        let h = EngineHarness()
        let a = h.connect(), b = h.connect()
        let first = a.ok(#"{"op":"collection.insert","collection":"c","token":"t-1","items":[{"id":"I:1"}]}"#)
        #expect(first["seq"] == 1)
        #expect(first["duplicate"] == nil)
        // Another connection retries (the first dropped): the original answer.
        let again = b.send(#"{"rid":7,"op":"collection.insert","collection":"c","token":"t-1","items":[{"id":"I:1"}]}"#)
        #expect(again == json(#"{"rid":7,"ok":true,"seq":1,"duplicate":true}"#))
        #expect(a.send(#"{"op":"get","collection":"c"}"#)["items"]?.arrayValue?.count == 1)
        // A rejected mutation's token is not remembered.
        #expect(a.error(#"{"op":"collection.remove","collection":"c","index":5,"token":"t-2"}"#) == "bad_index")
        #expect(a.ok(#"{"op":"collection.remove","collection":"c","index":0,"token":"t-2"}"#)["seq"] == 2)
        // On a batch, the batch's token; too long: bad_request.
        #expect(a.ok(#"{"op":"batch","token":"t-3","ops":[{"op":"update","model":{"id":"A"}}]}"#)["seq"] == 3)
        #expect(a.send(#"{"op":"batch","token":"t-3","ops":[]}"#)["duplicate"] == true)
        #expect(a.error(#"{"op":"update","token":5,"model":{"id":"A"}}"#) == "bad_request")
        #expect(a.send(#"{"op":"ping"}"#)["seq"] == 3)
        let long = String(repeating: "x", count: 129)
        #expect(a.error(#"{"op":"update","token":"\#(long)","model":{"id":"A"}}"#) == "bad_request")
    }

    @Test func tokensLeaveAfterBothWindows() {
        var config = EngineConfiguration()
        config.historyMutations = 2
        config.tokenRetention = 10
        let h = EngineHarness(configuration: config)
        let now = Mutex(0.0)
        h.engine.clock = { now.withLock { $0 } }
        let a = h.connect()
        a.ok(#"{"op":"update","token":"old","model":{"id":"A","n":1}}"#)
        for i in 2...4 { a.ok(#"{"op":"update","model":{"id":"A","n":\#(i)}}"#) }
        // Past the mutation window but within the time window: still known.
        #expect(a.send(#"{"op":"update","token":"old","model":{"id":"A"}}"#)["duplicate"] == true)
        now.withLock { $0 = 11 }
        a.ok(#"{"op":"update","model":{"id":"A","n":5}}"#)
        #expect(a.send(#"{"op":"update","token":"old","model":{"id":"A","n":6}}"#)["duplicate"] == nil)
    }

    @Test func sinceAnswersUnchangedOnlyWhenNothingShownChanged() {
        let h = EngineHarness()
        let a = h.connect(), w = h.connect()
        w.ok(#"{"op":"update","key":"k","model":{"title":"t","by":{"id":"U:1","n":"Ann"}}}"#)  // 1
        w.ok(#"{"op":"collection.insert","collection":"c","items":[{"id":"M:1","by":{"id":"U:1","n":"Ann"}}]}"#)  // 2
        w.ok(#"{"op":"update","model":{"id":"Other:1"}}"#)  // 3
        let query = #"{"type":"M","order":[{"path":"id"}]}"#
        a.ok(#"{"op":"subscribe","sub":"q0","query":\#(query)}"#)
        let unchanged = a.ok(#"{"op":"subscribe","sub":"k","key":"k","since":2}"#)
        #expect(unchanged == json(#"{"rid":null,"ok":true,"unchanged":true,"seq":3}"#))
        #expect(a.ok(#"{"op":"subscribe","sub":"c","collection":"c","since":2}"#)["unchanged"] == true)
        #expect(a.ok(#"{"op":"subscribe","sub":"i","ids":["U:1","Nobody:1"],"since":2}"#)["unchanged"] == true)
        #expect(a.ok(#"{"op":"subscribe","sub":"m","model":{"id":"M:1","by":{"id":"U:1","n":"Ann"}},"since":3}"#)["unchanged"] == true)
        #expect(a.ok(#"{"op":"subscribe","sub":"q","query":\#(query),"since":3}"#)["unchanged"] == true)
        // Before the collection was written: its value.
        #expect(a.ok(#"{"op":"subscribe","sub":"c1","collection":"c","since":1}"#)["items"]?.arrayValue?.count == 1)
        // A nested entity changes: every view holding it answers with its value.
        w.ok(#"{"op":"update","model":{"id":"U:1","n":"Bea"}}"#)  // 4
        for (sub, target) in [("k2", #""key":"k""#), ("c2", #""collection":"c""#), ("i2", #""ids":["U:1"]"#),
                              ("m2", #""model":{"id":"M:1","by":{"id":"U:1","n":"Ann"}}"#), ("q2", #""query":\#(query)"#)] {
            let r = a.ok(#"{"op":"subscribe","sub":"\#(sub)",\#(target),"since":3}"#)
            #expect(r["unchanged"] == nil, "\(sub)")
            #expect(r.compactString.contains("Bea"), "\(sub): \(r.compactString)")
        }
        // The subscription runs as usual after an unchanged answer.
        _ = a.take()
        w.ok(#"{"op":"update","key":"k","model":{"title":"u"}}"#)
        #expect(a.take().contains { $0["sub"] == "k" && $0["model"]?["title"] == "u" })
        #expect(a.error(#"{"op":"subscribe","sub":"z","key":"k","since":99}"#) == "bad_request")
        #expect(a.error(#"{"op":"subscribe","sub":"z","key":"k","since":1.5}"#) == "bad_request")
    }

    @Test func aFeedReplaysWhatChangedSinceInSeqOrder() {
        let h = EngineHarness()
        let a = h.connect(), w = h.connect()
        w.ok(#"{"op":"update","model":{"id":"P:1","n":1}}"#)  // 1
        w.ok(#"{"op":"update","model":{"id":"P:2","n":1}}"#)  // 2
        w.ok(#"{"op":"update","model":{"id":"Q:1","n":1}}"#)  // 3
        w.ok(#"{"op":"update","model":{"id":"P:1","n":2}}"#)  // 4
        w.ok(#"{"op":"delete","id":"P:2"}"#)                 // 5
        let r = a.ok(#"{"op":"subscribe","sub":"f","feed":{"types":["P"]},"since":1}"#)
        #expect(r["truncated"] == nil)
        let replayed = a.take()
        #expect(replayed == [
            json(#"{"event":"entity","sub":"f","seq":4,"id":"P:1","model":{"id":"P:1","n":2},"replayed":true}"#),
            json(#"{"event":"entity","sub":"f","seq":5,"id":"P:2","model":null,"replayed":true}"#),
        ])
        // Then it runs as usual.
        w.ok(#"{"op":"update","model":{"id":"P:3"}}"#)
        #expect(a.take().map { $0["id"] } == ["P:3"])
    }

    @Test func aFeedSinceBeforeTheHistoryIsTruncated() {
        var config = EngineConfiguration()
        config.historyMutations = 3
        let h = EngineHarness(configuration: config)
        let a = h.connect()
        #expect(a.ok(#"{"op":"hello"}"#)["limits"]?["history"] == 3)
        for i in 1...5 { a.ok(#"{"op":"update","model":{"id":"P:\#(i)"}}"#) }
        let r = a.ok(#"{"op":"subscribe","sub":"f","feed":{},"since":1}"#)
        #expect(r["truncated"] == true)
        #expect(a.take().isEmpty)
        let stats = a.send(#"{"op":"stats"}"#)["history"]
        #expect(stats?["mutations"] == 3)
        #expect(stats?["reaches_back_to"] == 2)
        #expect((stats?["bytes"]?.numberValue?.intValue ?? 0) > 0)
        let recent = a.ok(#"{"op":"subscribe","sub":"g","feed":{},"since":2}"#)
        #expect(recent["truncated"] == nil)
        #expect(a.take().map { $0["id"] } == ["P:3", "P:4", "P:5"])
    }

    @Test func syncAnswersAtOnceAndMinSeqWaitsForTheSeq() {
        let h = EngineHarness()
        let now = Mutex(0.0)
        h.engine.clock = { now.withLock { $0 } }
        let a = h.connect(), w = h.connect()
        w.ok(#"{"op":"update","model":{"id":"A","n":1}}"#)
        #expect(a.ok(#"{"op":"sync"}"#)["seq"] == 1)
        #expect(a.ok(#"{"op":"ping","min_seq":1}"#)["seq"] == 1)
        // A read for seq 2 waits (and the connection's later lines behind it).
        a.post(#"{"rid":1,"op":"get","id":"A","min_seq":2}"#)
        a.post(#"{"rid":2,"op":"ping"}"#)
        #expect(a.takeResponses().isEmpty)
        w.ok(#"{"op":"update","model":{"id":"A","n":2}}"#)
        let answered = a.takeResponses()
        #expect(answered.map { $0["rid"] } == [1, 2])
        #expect(answered.first?["model"]?["n"] == 2)
        // Never reached: unavailable after timeout_ms.
        a.post(#"{"rid":3,"op":"get","id":"A","min_seq":9,"timeout_ms":100}"#)
        h.engine.expireSeqWaits()
        #expect(a.takeResponses().isEmpty)
        now.withLock { $0 = 0.2 }
        h.engine.expireSeqWaits()
        h.pumpPublic()
        let late = a.takeResponses()
        #expect(late.first?["rid"] == 3)
        #expect(late.first?["error"]?["code"] == "unavailable")
        #expect(a.error(#"{"op":"ping","min_seq":-1}"#) == "bad_request")
    }

    /// A feed subscriber that leaves at random moments and comes back with
    /// `since` ends with the same records as one that never left — or is told
    /// `truncated` and reads them again.
    @Test(arguments: [1, 2, 3, 4, 5] as [UInt64])
    func aFeedThatLeavesAndResumesEndsWhereOneThatStayedDoes(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        var config = EngineConfiguration()
        config.historyMutations = 30
        // Seed 4: the entity bound trims the history first; seed 5: long
        // enough that the history's lists are compacted (past 1,024 dropped).
        if seed == 4 { config.historyEntities = 12 }
        let steps = seed == 5 ? 4000 : 300
        let h = EngineHarness(configuration: config)
        let w = h.connect()
        let stayed = h.connect()
        var b = h.connect()
        var away = false
        stayed.ok(#"{"op":"subscribe","sub":"f","feed":{"types":["P"]}}"#)
        var bSeq = b.ok(#"{"op":"subscribe","sub":"f","feed":{"types":["P"]}}"#)["seq"]!.numberValue!.intValue!
        var seenA: [String: JSON] = [:], seenB: [String: JSON] = [:]
        var truncations = 0
        // Records only: a nested entity is its reference (feeds are about records).
        func record(_ v: JSON) -> JSON {
            guard case .object(var o) = v else { return v }
            for i in o.members.indices {
                if case .object(let n) = o.members[i].value, let id = n["id"] { o.members[i].value = .object(JSONObject([.init(key: "id", value: id)])) }
            }
            return .object(o)
        }
        func take(_ c: TestConn, into map: inout [String: JSON], seq: inout Int) {
            for e in c.take() where e["event"] == "entity" {
                map[e["id"]!.stringValue!] = record(e["model"] ?? .null)
                seq = max(seq, e["seq"]?.numberValue?.intValue ?? 0)
            }
        }
        var ignored = 0
        for _ in 0..<steps {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0...5:
                let child = Bool.random(using: &rng) ? #","q":{"id":"Q:\#(Int.random(in: 0..<3, using: &rng))","v":\#(Int.random(in: 0..<5, using: &rng))}"# : ""
                w.ok(#"{"op":"update","model":{"id":"P:\#(Int.random(in: 0..<8, using: &rng))","n":\#(Int.random(in: 0..<4, using: &rng))\#(child)}}"#)
            case 6:
                w.ok(#"{"op":"update","model":{"id":"Q:\#(Int.random(in: 0..<3, using: &rng))","v":\#(Int.random(in: 0..<5, using: &rng))}}"#)
            case 7:
                _ = w.send(#"{"op":"delete","id":"P:\#(Int.random(in: 0..<8, using: &rng))"}"#)
            case 8:
                // B leaves; mutations go on while it is away.
                guard !away else { break }
                take(b, into: &seenB, seq: &bSeq)
                b.close()
                away = true
            default:
                // B comes back with the seq of the last thing it received.
                guard away else { break }
                away = false
                b = h.connect()
                let r = b.ok(#"{"op":"subscribe","sub":"f","feed":{"types":["P"]},"since":\#(bSeq)}"#)
                if r["truncated"] == true {
                    truncations += 1
                    #expect(b.take().isEmpty)
                    // Rebuild: read every record again.
                    seenB = [:]
                    for i in 0..<8 {
                        let v = b.send(#"{"op":"get","id":"P:\#(i)"}"#)["model"] ?? .null
                        if v != .null { seenB["P:\(i)"] = record(v) }
                    }
                }
                bSeq = max(bSeq, r["seq"]?.numberValue?.intValue ?? 0)
            }
            take(stayed, into: &seenA, seq: &ignored)
            if !away { take(b, into: &seenB, seq: &bSeq) }
        }
        if away {
            b = h.connect()
            let r = b.ok(#"{"op":"subscribe","sub":"f","feed":{"types":["P"]},"since":\#(bSeq)}"#)
            if r["truncated"] == true {
                seenB = [:]
                for i in 0..<8 {
                    let v = b.send(#"{"op":"get","id":"P:\#(i)"}"#)["model"] ?? .null
                    if v != .null { seenB["P:\(i)"] = record(v) }
                }
            }
            take(b, into: &seenB, seq: &bSeq)
        }
        // Deleted records are null in a feed's copy, absent in a rebuilt one.
        let a = seenA.filter { $0.value != .null }, bb = seenB.filter { $0.value != .null }
        #expect(a == bb, "seed \(seed), \(truncations) truncations")
        // And both are the store's records.
        for i in 0..<8 {
            let v = w.send(#"{"op":"get","id":"P:\#(i)"}"#)["model"] ?? .null
            #expect(a["P:\(i)"] == (v == .null ? nil : record(v)), "seed \(seed) P:\(i)")
        }
    }
}
