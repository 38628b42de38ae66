import ConcordJSON
import Testing

@testable import ConcordCore

/// One mutation's events on a connection come in a fixed order, whatever the
/// order of the hash tables inside (docs/PROTOCOL.md, "Event order within a
/// mutation"): model views, then key views by key, then collections by name,
/// then `entity` events by identity; subscriptions of one kind by name.
struct EventOrderTests {
    /// Names and keys in an order no hash table keeps by chance.
    static let names = (0..<24).map { i -> String in
        let k = (i * 7) % 24
        return k < 10 ? "0\(k)" : "\(k)"
    }

    /// Sets up one connection with `setup(name)` for every name, lets another
    /// connection send `mutation`, and returns the first connection's event subscriptions.
    static func eventOrder(setup: (String) -> [String], mutation: String) -> [String] {
        let h = EngineHarness()
        let a = h.connect()
        for n in names { for line in setup(n) { a.ok(line) } }
        h.connect().ok(mutation)
        return a.take().compactMap { $0["sub"]?.stringValue }
    }

    @Test func keyViewsByKey() {
        let subs = Self.eventOrder(setup: { n in
            [#"{"op":"update","key":"k\#(n)","model":{"holds":{"id":"P:1","v":0}}}"#, #"{"op":"subscribe","sub":"s\#(n)","key":"k\#(n)"}"#]
        }, mutation: #"{"op":"update","model":{"id":"P:1","v":1}}"#)
        #expect(subs == Self.names.sorted().map { "s\($0)" })
    }

    /// Model views in the order they were made; one view's subscribers
    /// (equal trees share a view) in its subscriber order.
    @Test func modelViewsInTheOrderTheyWereMade() {
        let distinct = Self.eventOrder(setup: { n in [#"{"op":"subscribe","sub":"m\#(n)","model":{"id":"P:1","v":0,"n":"\#(n)"}}"#] },
                                       mutation: #"{"op":"update","model":{"id":"P:1","v":1}}"#)
        #expect(distinct == Self.names.map { "m\($0)" })
        let shared = Self.eventOrder(setup: { n in [#"{"op":"subscribe","sub":"m\#(n)","model":{"id":"P:1","v":0}}"#] },
                                     mutation: #"{"op":"update","model":{"id":"P:1","v":1}}"#)
        #expect(shared == Self.names.map { "m\($0)" })
        // Views made first come first, whatever their names.
        let mixed = Self.eventOrder(setup: { n in [#"{"op":"subscribe","sub":"m\#(n)","model":{"id":"P:1","v":0,"odd":\#(Int(n)! % 2 == 1)}}"#] },
                                    mutation: #"{"op":"update","model":{"id":"P:1","v":1}}"#)
        let firstOdd = Int(Self.names[0])! % 2 == 1
        let want = Self.names.filter { (Int($0)! % 2 == 1) == firstOdd } + Self.names.filter { (Int($0)! % 2 == 1) != firstOdd }
        #expect(mixed == want.map { "m\($0)" })
    }

    @Test func entityEventsByIdentityThenName() {
        let h = EngineHarness()
        let a = h.connect()
        let ids = Self.names.map { "P:\($0)" }
        let list = ids.map { "\"\($0)\"" }.joined(separator: ",")
        a.ok(#"{"op":"subscribe","sub":"b","ids":[\#(list)]}"#)
        a.ok(#"{"op":"subscribe","sub":"a","ids":[\#(list)]}"#)
        let w = h.connect()
        let items = ids.map { #"{"id":"\#($0)","v":1}"# }.joined(separator: ",")
        w.ok(#"{"op":"update","model":{"all":[\#(items)]}}"#)
        let got = a.take().map { "\($0["sub"]?.stringValue ?? "") \($0["id"]?.stringValue ?? "")" }
        let want = ids.sorted().flatMap { ["a \($0)", "b \($0)"] }
        #expect(got == want)
    }

    /// An entity's watchers are kept in event order between events (sorted
    /// again only when the set changes): a subscription added or removed
    /// takes its place at once, and every watcher gets the same event.
    @Test func entityWatchersStayInOrderAsTheyChange() {
        let h = EngineHarness()
        let a = h.connect()
        let b = h.connect()
        for name in ["m", "c", "x"] { a.ok(#"{"op":"subscribe","sub":"\#(name)","ids":["P:1"]}"#) }
        b.ok(#"{"op":"subscribe","sub":"b","ids":["P:1"]}"#)
        // Two feeds as well: they get the same event as the watchers, after them.
        b.ok(#"{"op":"subscribe","sub":"f2","feed":{}}"#)
        b.ok(#"{"op":"subscribe","sub":"f1","feed":{}}"#)
        let w = h.connect()
        var v = 0
        func update() -> (a: [String], b: [String]) {
            v += 1
            w.ok(#"{"op":"update","model":{"id":"P:1","v":\#(v)}}"#)
            let ea = a.take(), eb = b.take()
            for e in ea + eb {
                #expect(e["event"]?.stringValue == "entity" && e["id"]?.stringValue == "P:1" && e["model"]?["v"] == .number(JSONNumber(v)))
            }
            return (ea.compactMap { $0["sub"]?.stringValue }, eb.compactMap { $0["sub"]?.stringValue })
        }
        #expect(update() == (["c", "m", "x"], ["b", "f1", "f2"]))
        #expect(update() == (["c", "m", "x"], ["b", "f1", "f2"]))
        a.ok(#"{"op":"subscribe","sub":"a","ids":["P:1"]}"#)
        #expect(update() == (["a", "c", "m", "x"], ["b", "f1", "f2"]))
        a.ok(#"{"op":"unsubscribe","sub":"c"}"#)
        #expect(update() == (["a", "m", "x"], ["b", "f1", "f2"]))
        for name in ["a", "m", "x"] { a.ok(#"{"op":"unsubscribe","sub":"\#(name)"}"#) }
        #expect(update() == ([], ["b", "f1", "f2"]))
        #expect(h.engine.idWatchers["P:1"]?.count == 1)
        b.ok(#"{"op":"unsubscribe","sub":"b"}"#)
        #expect(h.engine.idWatchers["P:1"] == nil)
    }

    @Test func clearEndsSubscriptionsByName() {
        let subs = Self.eventOrder(setup: { n in [#"{"op":"subscribe","sub":"s\#(n)","key":"k\#(n)"}"#] }, mutation: #"{"op":"clear"}"#)
        #expect(subs == Self.names.sorted().map { "s\($0)" })
    }

    @Test func kindsInAFixedOrder() {
        let h = EngineHarness()
        let a = h.connect()
        a.ok(#"{"op":"collection.insert","collection":"c","items":[{"id":"P:1","v":0}]}"#)
        a.ok(#"{"op":"update","key":"k","model":{"id":"P:1","v":0}}"#)
        a.ok(#"{"op":"subscribe","sub":"1","ids":["P:1"]}"#)
        a.ok(#"{"op":"subscribe","sub":"2","collection":"c"}"#)
        a.ok(#"{"op":"subscribe","sub":"3","key":"k"}"#)
        a.ok(#"{"op":"subscribe","sub":"4","model":{"id":"P:1","v":0}}"#)
        let w = h.connect()
        w.ok(#"{"op":"update","model":{"id":"P:1","v":1}}"#)
        let subs = a.take().compactMap { $0["sub"]?.stringValue }
        #expect(subs == ["4", "3", "2", "1"])
    }
}
