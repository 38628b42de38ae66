import ConcordJSON
import Testing

@testable import ConcordCore

/// PROTOCOL.md §6.6: a connection that does not read fast enough gets, per
/// subscription, what a `resume` would send, marked `"coalesced":true`,
/// instead of every event.
struct CoalescingTests {
    static func harness(soft: Int = 600) -> EngineHarness {
        var config = EngineConfiguration()
        config.outputSoftBytes = soft
        return EngineHarness(configuration: config)
    }

    @Test func aSlowReaderGetsTheLatestValueOfEveryViewOnceItDrains() {
        let h = Self.harness()
        let writer = h.connect()
        let slow = h.connect()
        slow.ok(#"{"op":"subscribe","sub":"k","key":"doc"}"#)
        slow.ok(#"{"op":"subscribe","sub":"m","model":{"id":"P:1","n":0}}"#)
        slow.ok(#"{"op":"subscribe","sub":"i","ids":["P:2"]}"#)
        slow.ok(#"{"op":"subscribe","sub":"c","collection":"list"}"#)
        slow.slow = true
        for n in 1...200 {
            writer.ok(#"{"op":"update","key":"doc","model":{"id":"D:1","n":\#(n)},"context":"w\#(n)"}"#)
            writer.ok(#"{"op":"update","model":{"id":"P:1","n":\#(n)}}"#)
            writer.ok(#"{"op":"update","model":{"id":"P:2","n":\#(n)}}"#)
            writer.ok(#"{"op":"collection.insert","collection":"list","index":0,"items":[{"id":"I:\#(n)"}]}"#)
        }
        // Bounded: the soft limit plus at most one mutation's events.
        #expect(slow.unreadBytes < 600 + 400, "unread \(slow.unreadBytes)")
        #expect(h.engine.isCoalescing(slow.id))
        slow.readAll()
        #expect(!h.engine.isCoalescing(slow.id))
        let events = slow.take()
        #expect(events.count < 40, "\(events.count) events")
        // Every subscription ends at the current value; nothing older after something newer.
        var lastN: [String: Int] = [:]
        for e in events {
            let sub = e["sub"]!.stringValue!
            if let n = e["model"]?["n"]?.numberValue?.intValue {
                #expect(n >= lastN[sub, default: 0], "\(sub) went back to \(n)")
                lastN[sub] = n
            }
        }
        #expect(lastN["k"] == 200)
        #expect(lastN["m"] == 200)
        #expect(lastN["i"] == 200)
        let coalesced = events.filter { $0["coalesced"] == true }
        #expect(Set(coalesced.map { $0["sub"]!.stringValue! }) == ["k", "m", "i", "c"])
        #expect(coalesced.first { $0["sub"] == "k" }?["context"] == "w200")
        // The collection's coalesced event takes the client to the server's list.
        let reset = coalesced.first { $0["sub"] == "c" }?["changes"]?.arrayValue?.first
        #expect(reset?["op"] == "reset")
        #expect(reset?["items"]?.arrayValue?.count == 200)
        // Afterwards events flow one by one again.
        writer.ok(#"{"op":"update","key":"doc","model":{"id":"D:1","n":201}}"#)
        slow.readAll()
        let after = slow.take()
        #expect(after.count == 1)
        #expect(after.first?["coalesced"] == nil)
        #expect(after.first?["model"]?["n"] == 201)
    }

    @Test func aResponseIsWrittenAfterTheCoalescedEventsItFollows() {
        let h = Self.harness(soft: 300)
        let writer = h.connect()
        let slow = h.connect()
        slow.ok(#"{"op":"subscribe","sub":"k","key":"doc"}"#)
        slow.slow = true
        for n in 1...50 { writer.ok(#"{"op":"update","key":"doc","model":{"id":"D:1","n":\#(n)}}"#) }
        #expect(h.engine.isCoalescing(slow.id))
        // The ping's answer must come after an event carrying n = 50 (§6.4 barrier).
        let pong = slow.send(#"{"op":"ping"}"#)
        #expect(pong["seq"] == 50)
        let events = slow.take()
        #expect(events.last?["model"]?["n"] == 50)
        #expect(events.last?["coalesced"] == true)
    }

    @Test func viewEndingDeletesAndUserPausesSurviveCoalescing() {
        let h = Self.harness(soft: 300)
        let writer = h.connect()
        let slow = h.connect()
        slow.ok(#"{"op":"subscribe","sub":"k","key":"doc"}"#)
        slow.ok(#"{"op":"subscribe","sub":"p","key":"other"}"#)
        slow.ok(#"{"op":"pause","sub":"p"}"#)
        slow.slow = true
        for n in 1...50 {
            writer.ok(#"{"op":"update","key":"doc","model":{"id":"D:1","n":\#(n)}}"#)
            writer.ok(#"{"op":"update","key":"other","model":{"id":"D:2","n":\#(n)}}"#)
        }
        #expect(h.engine.isCoalescing(slow.id))
        writer.ok(#"{"op":"delete","key":"doc"}"#)
        slow.readAll()
        let events = slow.take()
        #expect(events.last?["event"] == "delete")
        #expect(events.last?["sub"] == "k")
        #expect(!events.contains { $0["sub"] == "p" }, "a paused subscription stays paused")
        // Resuming the paused one sends exactly its catch-up.
        slow.ok(#"{"op":"resume","sub":"p"}"#)
        let resumed = slow.take()
        #expect(resumed.count == 1)
        #expect(resumed.first?["model"]?["n"] == 50)
        #expect(resumed.first?["coalesced"] == nil)
    }

    @Test func feedSubscribersGetEachChangedEntityOnce() {
        let h = Self.harness(soft: 400)
        let writer = h.connect()
        let slow = h.connect()
        slow.ok(#"{"op":"subscribe","sub":"f","feed":{"types":["P"]}}"#)
        slow.slow = true
        for n in 1...100 { writer.ok(#"{"op":"update","model":{"id":"P:\#(n % 5)","n":\#(n)}}"#) }
        #expect(h.engine.isCoalescing(slow.id))
        slow.readAll()
        let coalesced = slow.take().filter { $0["coalesced"] == true }
        #expect(coalesced.count <= 5)
        for e in coalesced {
            let id = e["id"]!.stringValue!
            #expect(e["model"] == h.engine.store.entity(id))
        }
    }
}
