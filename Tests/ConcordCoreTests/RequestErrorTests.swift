import ConcordJSON
import Testing

@testable import ConcordCore

struct RequestErrorTests {
    @Test(arguments: [
        (#"{"op":"#, "parse_error"),
        (#"[1,2]"#, "parse_error"),
        (#"{"op":"ping"} x"#, "parse_error"),
        (#"{"op":NaN}"#, "parse_error"),
        (#"{"rid":1}"#, "bad_request"),
        (#"{"op":5}"#, "bad_request"),
        (#"{"op":"fly"}"#, "unknown_op"),
        (#"{"op":"get"}"#, "bad_request"),
        (#"{"op":"get","key":"a","id":"b"}"#, "bad_request"),
        (#"{"op":"subscribe","sub":"s"}"#, "bad_request"),
        (#"{"op":"subscribe","sub":"s","key":"a","ids":[]}"#, "bad_request"),
        (#"{"op":"subscribe","sub":"","key":"a"}"#, "bad_request"),
        (#"{"op":"subscribe","sub":"s","ids":[1.5]}"#, "bad_request"),
        (#"{"op":"unsubscribe","sub":"zz"}"#, "no_such_sub"),
        (#"{"op":"pause","sub":"zz"}"#, "no_such_sub"),
        (#"{"op":"update","model":[1]}"#, "bad_request"),
        (#"{"op":"update","model":{},"mode":"add"}"#, "bad_request"),
        (#"{"op":"delete"}"#, "bad_request"),
        (#"{"op":"delete","id":"a","key":"b"}"#, "bad_request"),
        (#"{"op":"batch","ops":{}}"#, "bad_request"),
        (#"{"op":"schema","required":{"A":"b"}}"#, "bad_request"),
    ])
    func badInputGetsTheRightCode(line: String, code: String) {
        let h = EngineHarness()
        let a = h.connect()
        let r = a.send(line)
        #expect(r["ok"] == false)
        #expect(r["error"]?["code"] == .string(code))
        #expect((r["error"]?["message"]?.stringValue ?? "").isEmpty == false)
        // The connection still works.
        #expect(a.send(#"{"op":"ping"}"#)["ok"] == true)
    }

    @Test func ridIsEchoedWhenReadableAndNullOtherwise() {
        let h = EngineHarness()
        let a = h.connect()
        #expect(a.send(#"{"op":"ping","rid":"r1"}"#)["rid"] == "r1")
        #expect(a.send(#"{"op":"fly","rid":7}"#)["rid"] == 7)
        let r = a.send(#"{"op":"ping","rid":{"a":1}}"#)
        #expect(r["rid"] == .null)
        #expect(r["error"]?["code"] == "bad_request")
        #expect(a.send(#"{"op":"ping"}"#)["rid"] == .null)
    }

    @Test func depthLimitCountsTheRequestObjectAsLevelOne() {
        var cfg = EngineConfiguration()
        cfg.maxDepth = 4
        let h = EngineHarness(configuration: cfg)
        let a = h.connect()
        #expect(a.send(#"{"op":"update","model":{"id":"A","x":{"y":1}}}"#)["ok"] == true)  // depth 3
        #expect(a.send(#"{"op":"update","model":{"id":"A","x":{"y":[1]}}}"#)["ok"] == true)  // depth 4
        #expect(a.error(#"{"op":"update","model":{"id":"A","x":{"y":[[1]]}}}"#) == "too_deep")
    }

    /// A value written as it came in the request is within the bound
    /// without a walk (the parser bounded the request); one built from the
    /// request is walked: an identity repeated deeper than its fullest
    /// occurrence carries that occurrence down with it.
    @Test func anIdentityResolvedDeeperThanItCameIsHeldToTheBound() {
        var cfg = EngineConfiguration()
        cfg.maxDepth = 6
        let h = EngineHarness(configuration: cfg)
        let a = h.connect()
        // Every level of the request within 6; P:1 would hold A:1's full
        // value at P(1) a(2) b(3) c=A(4) x(5) y(6): 6 levels > 5.
        let seq = h.engine.seq
        #expect(a.error(#"{"op":"update","model":{"id":"P:1","a":{"b":{"c":{"id":"A:1"}}},"z":{"id":"A:1","x":{"y":{"w":1}}}}}"#) == "too_deep")
        #expect(h.engine.seq == seq)
        #expect(h.engine.store.entity("P:1") == nil)
        // The same entities, A:1's full value one level shallower: taken.
        a.ok(#"{"op":"update","model":{"id":"P:1","a":{"b":{"c":{"id":"A:1"}}},"z":{"id":"A:1","x":{"y":1}}}}"#)
        #expect(h.engine.store.entity("P:1")?.height(cappedAt: 20) == 5)
        #expect(h.engine.store.invariantViolations().isEmpty)
    }

    /// A merge that gives only scalars is within the bound without a walk
    /// (its value is the stored one, within the bound, with scalar members
    /// set); one that gives an object is walked; and a scalar merge of an
    /// entity whose child grows in the same batch is still held to the
    /// bound, in either order (the child's growth reaches it by substitution).
    @Test func mergesAreHeldToTheBoundAndScalarMergesNeedNoWalk() {
        var cfg = EngineConfiguration()
        cfg.maxDepth = 10  // stored values: 9 levels at most
        let h = EngineHarness(configuration: cfg)
        let a = h.connect()
        // P:1 at the bound: 9 levels.
        a.ok(#"{"op":"update","model":{"id":"P:1","a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":{"i":1}}}}}}}}}}"#)
        #expect(h.engine.store.entity("P:1")?.height(cappedAt: 20) == 9)
        a.ok(#"{"op":"update","mode":"merge","model":{"id":"P:1","n":1,"a":7}}"#)
        #expect(h.engine.store.entity("P:1")?.height(cappedAt: 20) == 1)
        a.ok(#"{"op":"update","model":{"id":"P:1","a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":{"i":1}}}}}}}}}}"#)
        a.ok(#"{"op":"update","mode":"merge","model":{"id":"P:1","n":2}}"#)
        #expect(h.engine.store.entity("P:1")?.height(cappedAt: 20) == 9)
        // A merge giving an object is walked: a shallow request holding
        // P:1 (9 levels) one level down would store 10.
        #expect(a.error(#"{"op":"update","mode":"merge","model":{"id":"P:3","z":{"id":"P:1"}}}"#) == "too_deep")
        #expect(h.engine.store.entity("P:3") == nil)
        // P:2 holds A:1 four levels down (P a b c d=A): 5 levels.
        a.ok(#"{"op":"update","model":{"id":"P:2","a":{"b":{"c":{"d":{"id":"A:1","x":1}}}}}}"#)
        #expect(h.engine.store.entity("P:2")?.height(cappedAt: 20) == 5)
        // A:1 growing to 6 levels would take P:2 to 10: refused, with a scalar merge of P:2 in the batch before or after it.
        let deeper = #"{"op":"update","model":{"id":"A:1","x":{"y":{"z":{"w":{"v":{"u":1}}}}}}}"#
        let merge = #"{"op":"update","mode":"merge","model":{"id":"P:2","n":1}}"#
        let seq = h.engine.seq
        for ops in [[deeper, merge], [merge, deeper], [deeper]] {
            #expect(a.error(#"{"op":"batch","ops":["# + ops.joined(separator: ",") + "]}") == "too_deep", "\(ops)")
        }
        #expect(h.engine.seq == seq)
        #expect(h.engine.store.entity("P:2")?.height(cappedAt: 20) == 5)
        #expect(h.engine.store.invariantViolations().isEmpty)
    }

    @Test func subscriptionLimitAndDuplicateNames() {
        var cfg = EngineConfiguration()
        cfg.maxSubscriptionsPerConnection = 2
        let h = EngineHarness(configuration: cfg)
        let a = h.connect()
        a.ok(#"{"op":"subscribe","sub":"a","key":"k"}"#)
        #expect(a.error(#"{"op":"subscribe","sub":"a","key":"k"}"#) == "sub_exists")
        a.ok(#"{"op":"subscribe","sub":"b","key":"k"}"#)
        #expect(a.error(#"{"op":"subscribe","sub":"c","key":"k"}"#) == "limit_exceeded")
        a.ok(#"{"op":"unsubscribe","sub":"a"}"#)
        a.ok(#"{"op":"subscribe","sub":"c","key":"k"}"#)
    }

    @Test func helloReportsLimits() {
        let h = EngineHarness()
        let r = h.connect().ok(#"{"op":"hello","client":"t"}"#)
        #expect(r["protocol"] == 1)
        #expect(r["id_key"] == "id")
        #expect(r["limits"]?["max_depth"] == 128)
        #expect(r["limits"]?["max_line_bytes"] == .int(16 << 20))
        #expect(r["limits"]?["max_subscriptions"] == 65536)
    }

    @Test func integerAndStringIdentitiesAreOneEntity() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"update","model":{"id":12,"v":1}}"#)
        #expect(a.send(#"{"op":"get","id":"12"}"#)["model"]?["v"] == 1)
        a.ok(#"{"op":"update","model":{"id":"x","a":{"id":1.5,"v":1},"b":{"id":"","v":2}}}"#)
        #expect(a.send(#"{"op":"stats"}"#)["entities"] == 2)
    }
}
