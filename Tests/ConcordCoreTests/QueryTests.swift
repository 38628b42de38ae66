import ConcordJSON
import ConcordProtocol
import ConcordTestSupport
import Testing

@testable import ConcordCore

/// Live queries (PROTOCOL.md §3.1).
@Suite struct QueryTests {
    /// Applies a query event's changes to a window, as a table view would.
    static func apply(_ changes: [JSON], to list: inout [JSON]) {
        for c in changes {
            let i = c["index"]?.numberValue?.intValue ?? 0
            switch c["op"]?.stringValue {
            case "insert": list.insert(contentsOf: c["items"]?.arrayValue ?? [], at: i)
            case "remove": list.removeSubrange(i ..< i + (c["count"]?.numberValue?.intValue ?? 1))
            case "update": list[i] = c["item"] ?? .null
            case "reset": list = c["items"]?.arrayValue ?? []
            default: Issue.record("unknown change \(c.compactString)")
            }
        }
    }

    /// Posts 1–5 (dates 10…50) by Ann (Person:1: posts 1, 3, 5) and Bob (Person:2).
    static func posts(_ h: EngineHarness, _ c: TestConn) {
        for (i, author) in [(1, 1), (2, 2), (3, 1), (4, 2), (5, 1)] {
            let name = author == 1 ? "Ann" : "Bob"
            c.ok(#"{"op":"update","model":{"id":"Post:\#(i)","date":\#(i * 10),"author":{"id":"Person:\#(author)","name":"\#(name)"}}}"#)
        }
    }

    @Test func subscribeAndGetShowTheWindowAndTheCount() {
        let h = EngineHarness()
        let c = h.connect()
        Self.posts(h, c)
        let q = #"{"type":"Post","where":{"path":"author.id","eq":"Person:1"},"order":[{"path":"date","desc":true}],"limit":2}"#
        let r = c.ok(#"{"op":"subscribe","sub":"q","query":\#(q)}"#)
        #expect(r["items"]?.arrayValue?.map { $0["id"] } == ["Post:5", "Post:3"])
        #expect(r["count"] == .int(3))
        #expect(r["seq"] == .int(5))
        // Values are materialized: the author's current name is in the item.
        #expect(r["items"]?.arrayValue?.first?["author"]?["name"] == "Ann")
        let g = c.ok(#"{"op":"get","query":\#(q)}"#)
        #expect(g["items"] == r["items"])
        #expect(g["count"] == .int(3))
        // Offset past the end: an empty window, the count still told.
        let far = c.ok(#"{"op":"get","query":{"type":"Post","offset":10}}"#)
        #expect(far["items"] == [])
        #expect(far["count"] == .int(5))
    }

    @Test func aNestedEntityChangeMovesItems() {
        let h = EngineHarness()
        let c = h.connect()
        Self.posts(h, c)
        let r = c.ok(#"{"op":"subscribe","sub":"q","query":{"type":"Post","order":[{"path":"author.name"},{"path":"date"}]}}"#)
        var window = r["items"]?.arrayValue ?? []
        #expect(window.map { $0["id"] } == ["Post:1", "Post:3", "Post:5", "Post:2", "Post:4"])
        _ = c.take()
        // Renaming Bob to Aaron moves his posts before Ann's.
        c.ok(#"{"op":"update","model":{"id":"Person:2","name":"Aaron"},"context":"rename"}"#)
        let events = c.take()
        #expect(events.count == 1)
        #expect(events.first?["event"] == "query")
        #expect(events.first?["context"] == "rename")
        Self.apply(events.first?["changes"]?.arrayValue ?? [], to: &window)
        #expect(window.map { $0["id"] } == ["Post:2", "Post:4", "Post:1", "Post:3", "Post:5"])
        #expect(window.map { $0["author"]?["name"] } == ["Aaron", "Aaron", "Ann", "Ann", "Ann"])
        #expect(window == c.ok(#"{"op":"get","query":{"type":"Post","order":[{"path":"author.name"},{"path":"date"}]}}"#)["items"]?.arrayValue)
    }

    @Test func aWindowRefillsAndShifts() {
        let h = EngineHarness()
        let c = h.connect()
        Self.posts(h, c)
        let r = c.ok(#"{"op":"subscribe","sub":"q","query":{"type":"Post","order":[{"path":"date"}],"offset":1,"limit":2}}"#)
        var window = r["items"]?.arrayValue ?? []
        #expect(window.map { $0["id"] } == ["Post:2", "Post:3"])
        func step(_ line: String, _ expected: [String], count: Int, changes maxChanges: Int) -> Void {
            c.ok(line)
            let e = c.take()
            #expect(e.count == 1, "\(line)")
            let changes = e.first?["changes"]?.arrayValue ?? []
            #expect(changes.count <= maxChanges, "\(line): \(changes.map(\.compactString))")
            Self.apply(changes, to: &window)
            #expect(window.map { $0["id"]?.stringValue ?? "?" } == expected, "\(line)")
            #expect(e.first?["count"] == .int(count))
        }
        // A new first item shifts the window: one in front, one out at the end.
        step(#"{"op":"update","model":{"id":"Post:0","date":0}}"#, ["Post:1", "Post:2"], count: 6, changes: 2)
        // Leaving from inside the window: removed, refilled from behind.
        step(#"{"op":"delete","id":"Post:2"}"#, ["Post:1", "Post:3"], count: 5, changes: 2)
        // Moving from inside to behind the window.
        step(#"{"op":"update","model":{"id":"Post:1","date":99}}"#, ["Post:3", "Post:4"], count: 5, changes: 2)
        // An item behind the window changes: no event but the count... unchanged: none at all.
        c.ok(#"{"op":"update","model":{"id":"Post:1","date":98}}"#)
        #expect(c.take().isEmpty)
        // In place: one update.
        step(#"{"op":"update","model":{"id":"Post:3","date":30,"title":"x"}}"#, ["Post:3", "Post:4"], count: 5, changes: 1)
        // Entering behind the window: the count changes, the window does not.
        step(#"{"op":"update","model":{"id":"Post:7","date":1000}}"#, ["Post:3", "Post:4"], count: 6, changes: 0)
    }

    @Test func batchesGiveOneEventAndOriginDoesNotSuppress() {
        let h = EngineHarness()
        let c = h.connect()
        Self.posts(h, c)
        c.ok(#"{"op":"subscribe","sub":"q","query":{"type":"Post","order":[{"path":"date"}]}}"#)
        _ = c.take()
        c.ok(#"{"op":"batch","origin":"q","ops":[{"op":"update","model":{"id":"Post:9","date":1}},{"op":"delete","id":"Post:3"},{"op":"update","model":{"id":"Post:8","date":2}}]}"#)
        let e = c.take()
        #expect(e.count == 1)
        #expect(e.first?["count"] == 6)
    }

    @Test func pauseResumeAndClear() {
        let h = EngineHarness()
        let c = h.connect()
        Self.posts(h, c)
        c.ok(#"{"op":"subscribe","sub":"q","query":{"type":"Post","order":[{"path":"date"}],"limit":2}}"#)
        c.ok(#"{"op":"pause","sub":"q"}"#)
        c.ok(#"{"op":"update","model":{"id":"Post:0","date":0}}"#, )
        c.ok(#"{"op":"update","model":{"id":"Post:9","date":99},"context":"last"}"#)
        #expect(c.take().isEmpty)
        c.ok(#"{"op":"resume","sub":"q"}"#)
        let e = c.take()
        #expect(e.count == 1)
        #expect(e.first?["changes"] == [["op": "reset", "items": .array(c.ok(#"{"op":"get","query":{"type":"Post","order":[{"path":"date"}],"limit":2}}"#)["items"]!.arrayValue!)]])
        #expect(e.first?["count"] == 7)
        #expect(e.first?["context"] == "last")
        // Changes that cancel out send nothing on resume.
        c.ok(#"{"op":"pause","sub":"q"}"#)
        c.ok(#"{"op":"update","model":{"id":"Post:0","date":-1}}"#)
        c.ok(#"{"op":"update","model":{"id":"Post:0","date":0}}"#)
        c.ok(#"{"op":"resume","sub":"q"}"#)
        #expect(c.take().isEmpty)
        c.ok(#"{"op":"clear"}"#)
        #expect(c.take().map { $0["event"] } == ["delete"])
        #expect(h.engine.queries.views.isEmpty)
        #expect(c.error(#"{"op":"unsubscribe","sub":"q"}"#) == "no_such_sub")
    }

    @Test func equalDefinitionsShareOneView() {
        let h = EngineHarness()
        let a = h.connect(), b = h.connect()
        Self.posts(h, a)
        a.ok(#"{"op":"subscribe","sub":"x","query":{"type":"Post","where":{"path":"author.id","eq":"Person:1"},"limit":5}}"#)
        b.ok(#"{"op":"subscribe","sub":"y","query":{"limit":5,"where":{"eq":"Person:1","path":["author","id"]},"type":"Post"}}"#)
        #expect(h.engine.queries.views.count == 1)
        a.ok(#"{"op":"update","model":{"id":"Post:6","date":60,"author":{"id":"Person:1"}}}"#)
        #expect(a.take().count == 1)
        #expect(b.take().count == 1)
        a.ok(#"{"op":"unsubscribe","sub":"x"}"#)
        #expect(h.engine.queries.views.count == 1)
        b.close()
        // Its subscription ends, and the dropped view is unfiled from the
        // indexes, as deferred work between turns.
        #expect(h.engine.hasDeferredWork)
        while h.engine.doDeferredWork(units: 1) {}
        #expect(h.engine.queries.views.isEmpty)
        #expect(h.engine.queries.types.isEmpty)
        #expect(h.engine.queries.memberOf.isEmpty)
    }

    /// `eq` and `in` on arrays and objects are found through the equality
    /// index like scalars (not tested on every update of the type), and
    /// values equal as JSON — members in another order, numbers spelled
    /// otherwise — are filed together; strings are equal by code point.
    @Test func equalityOnArraysAndObjectsIsIndexed() {
        let h = EngineHarness()
        let c = h.connect(), w = h.connect()
        w.ok(#"{"op":"update","model":{"id":"Post:1","tags":["a","b"],"at":{"city":"Paris","n":1}}}"#)
        w.ok(#"{"op":"update","model":{"id":"Post:2","tags":["b","a"],"at":{"n":1.0,"city":"Paris"}}}"#)
        w.ok(#"{"op":"update","model":{"id":"Post:3","tags":["caf\u00e9"],"at":{"city":"Lyon","n":[1,{"x":null}]}}}"#)
        func ids(_ r: JSON) -> [String] { r["items"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? [] }
        #expect(ids(c.ok(#"{"op":"subscribe","sub":"tags","query":{"type":"Post","where":{"path":"tags","eq":["a","b"]}}}"#)) == ["Post:1"])
        #expect(ids(c.ok(#"{"op":"subscribe","sub":"at","query":{"type":"Post","where":{"path":"at","eq":{"n":1e0,"city":"Paris"}}}}"#)) == ["Post:1", "Post:2"])
        #expect(ids(c.ok(#"{"op":"subscribe","sub":"in","query":{"type":"Post","where":{"path":"tags","in":[["caf\u00e9"],["b","a"],"x"]}}}"#)) == ["Post:2", "Post:3"])
        // Strings are equal when their code points are: "e" + U+0301 is not "é".
        #expect(ids(c.ok(#"{"op":"subscribe","sub":"nfd","query":{"type":"Post","where":{"path":"tags","eq":["cafe\u0301"]}}}"#)) == [])
        #expect(ids(c.ok(#"{"op":"subscribe","sub":"deep","query":{"type":"Post","where":{"all":[{"path":"at","eq":{"city":"Lyon","n":[1.0,{"x":null}]}},{"path":"tags","exists":true}]}}}"#)) == ["Post:3"])
        let tq = h.engine.queries.types["Post"]
        #expect(tq?.unindexed.isEmpty == true && tq?.ranges.isEmpty == true)
        // Distinct filing keys: "e" + U+0301 files with "é" (the index finds
        // candidates; each still tests its condition, by code point).
        #expect(tq?.byValue.values.reduce(0) { $0 + $1.count } == 6)
        // Found by value: entering, leaving, and an equal value written otherwise.
        w.ok(#"{"op":"update","model":{"id":"Post:4","tags":["a","b"],"at":{"city":"Paris","n":10e-1}}}"#)
        w.ok(#"{"op":"update","mode":"merge","model":{"id":"Post:1","tags":["a"]}}"#)
        w.ok(#"{"op":"update","mode":"merge","model":{"id":"Post:2","tags":["cafe\u0301"]}}"#)
        var got: [String: [String]] = [:]
        for e in c.take() { got[e["sub"]?.stringValue ?? "", default: []].append(e["changes"]?.compactString ?? "") }
        #expect(got["tags"] == [#"[{"op":"insert","index":1,"items":[{"id":"Post:4","tags":["a","b"],"at":{"city":"Paris","n":10e-1}}]}]"#,
                                #"[{"op":"remove","index":0,"count":1}]"#])
        #expect(got["at"]?.count == 3)
        // Post:4's ["a","b"] is not ["b","a"]; Post:2 now holds "cafe" + U+0301,
        // which is not "café": it leaves `in` and enters `nfd`.
        #expect(got["in"] == [#"[{"op":"remove","index":0,"count":1}]"#])
        #expect(got["nfd"] == [#"[{"op":"insert","index":0,"items":[{"id":"Post:2","tags":["cafe"# + "\u{301}" + #""],"at":{"n":1.0,"city":"Paris"}}]}]"#])
        #expect(got["deep"] == nil)
    }

    /// A client cannot grow the server's query memory without bound: views
    /// and the entities they hold are capped by configuration.
    @Test func queryViewsAndTheirEntitiesAreBounded() {
        var config = EngineConfiguration()
        config.maxQueryViews = 2
        config.maxQueryEntities = 6
        let h = EngineHarness(configuration: config)
        let c = h.connect()
        Self.posts(h, c)
        c.ok(#"{"op":"subscribe","sub":"a","query":{"type":"Post","limit":1}}"#)   // 5 members
        // One more entity: 6 in all, still allowed; a second list of 5 would make 11.
        let other = #"{"type":"Post","order":[{"path":"date","desc":true}]}"#
        #expect(c.error(#"{"op":"subscribe","sub":"b","query":\#(other)}"#) == "limit_exceeded")
        #expect(c.error(#"{"op":"get","query":\#(other)}"#) == "limit_exceeded")
        #expect(h.engine.queries.views.count == 1)
        // Another page of the same list shares its matches: it holds nothing more.
        let held = h.engine.queries.heldMembers
        let page = c.ok(#"{"op":"subscribe","sub":"b","query":{"type":"Post","offset":1,"limit":2}}"#)
        #expect(page["items"]?.arrayValue?.compactMap { $0["id"]?.stringValue } == ["Post:2", "Post:3"] && page["count"] == 5)
        #expect(c.ok(#"{"op":"get","query":{"type":"Post","offset":4}}"#)["items"]?.arrayValue?.count == 1)
        #expect(h.engine.queries.heldMembers == held && h.engine.queries.views.count == 1 && h.engine.queries.windows.count == 2)
        // Sharing a definition costs nothing more; a third definition is one too many, even a page of the same list.
        c.ok(#"{"op":"subscribe","sub":"b2","query":{"type":"Post","limit":1}}"#)
        #expect(c.error(#"{"op":"subscribe","sub":"c","query":{"type":"Post","where":{"path":"date","eq":10}}}"#) == "limit_exceeded")
        #expect(c.error(#"{"op":"subscribe","sub":"d","query":{"type":"Post","offset":3}}"#) == "limit_exceeded")
        #expect(h.engine.queries.views.count == 1 && h.engine.queries.windows.count == 2)
        // The list lives while one of its pages does.
        c.ok(#"{"op":"unsubscribe","sub":"a"}"#)
        c.ok(#"{"op":"unsubscribe","sub":"b2"}"#)
        #expect(h.engine.queries.views.count == 1 && h.engine.queries.windows.count == 1)
        c.ok(#"{"op":"update","model":{"id":"Post:0","date":0}}"#)
        let e = c.take().first { $0["sub"] == "b" }
        #expect(e?["count"] == 6 && e?["changes"]?.arrayValue?.count == 2)
        c.ok(#"{"op":"unsubscribe","sub":"b"}"#)
        #expect(h.engine.queries.views.isEmpty && h.engine.queries.windows.isEmpty)
    }

    @Test(arguments: [
        (#"{"type":1}"#, "query.type"),
        (#"{}"#, "query.type is missing"),
        (#"{"type":"T","where":{"path":"a","foo":1}}"#, "unknown operator 'foo'"),
        (#"{"type":"T","where":{"path":"a","eq":1,"ne":2}}"#, "two operators"),
        (#"{"type":"T","where":{"eq":1}}"#, "needs 'path'"),
        (#"{"type":"T","where":{"path":"a..b","eq":1}}"#, "query.where.path"),
        (#"{"type":"T","where":{"path":[],"eq":1}}"#, "query.where.path"),
        (#"{"type":"T","where":{"all":[{"path":"a","eq":1},{"path":"b","bogus":2}]}}"#, "query.where.all[1]"),
        (#"{"type":"T","where":{"not":{"path":"a","in":3}}}"#, "query.where.not.in"),
        (#"{"type":"T","where":{"path":"a","exists":1}}"#, "exists must be true or false"),
        (#"{"type":"T","where":{"path":"a","prefix":1}}"#, "prefix must be a string"),
        (#"{"type":"T","order":[{"path":"a","up":true}]}"#, "query.order[0]"),
        (#"{"type":"T","order":{"path":"a"}}"#, "query.order must be an array"),
        (#"{"type":"T","offset":-1}"#, "offset"),
        (#"{"type":"T","limit":0}"#, "limit"),
        (#"{"type":"T","limit":2.5}"#, "limit"),
    ])
    func malformedQueriesAreBadRequests(query: String, message: String) {
        let h = EngineHarness()
        let c = h.connect()
        for line in [#"{"op":"subscribe","sub":"q","query":\#(query)}"#, #"{"op":"get","query":\#(query)}"#] {
            let r = c.send(line)
            #expect(r["error"]?["code"] == "bad_request", "\(line)")
            #expect(r["error"]?["message"]?.stringValue?.contains(message) == true, "\(r.compactString)")
        }
    }

    @Test func conditionsFollowTheContract() {
        let h = EngineHarness()
        let c = h.connect()
        c.ok(#"{"op":"update","model":{"id":"T:1","n":1,"s":"apple","tags":["a","b"],"x":null}}"#)
        c.ok(#"{"op":"update","model":{"id":"T:2","n":2.0,"s":"banana","tags":[]}}"#)
        c.ok(#"{"op":"update","model":{"id":"T:3","n":"3","s":"apricot"}}"#)
        func ids(_ cond: String) -> [String] {
            c.ok(#"{"op":"get","query":{"type":"T","where":\#(cond)}}"#)["items"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []
        }
        #expect(ids(#"{"path":"n","eq":2}"#) == ["T:2"])               // numbers by value
        #expect(ids(#"{"path":"n","ne":2}"#) == ["T:1", "T:3"])
        #expect(ids(#"{"path":"n","gt":1}"#) == ["T:2"])               // "3" is a string: no order with a number
        #expect(ids(#"{"path":"s","lt":"b"}"#) == ["T:1", "T:3"])
        #expect(ids(#"{"path":"s","prefix":"ap"}"#) == ["T:1", "T:3"])
        #expect(ids(#"{"path":"tags","contains":"b"}"#) == ["T:1"])
        #expect(ids(#"{"path":"x","exists":true}"#) == ["T:1"])         // null is present
        #expect(ids(#"{"path":"x","exists":false}"#) == ["T:2", "T:3"])
        #expect(ids(#"{"path":"missing","ne":1}"#) == ["T:1", "T:2", "T:3"])
        #expect(ids(#"{"path":"missing","lt":1}"#) == [])
        #expect(ids(#"{"path":"n","in":[1,"3"]}"#) == ["T:1", "T:3"])
        #expect(ids(#"{"any":[{"path":"n","eq":1},{"not":{"path":"s","prefix":"a"}}]}"#) == ["T:1", "T:2"])
        // Order: missing < null < numbers < strings < arrays; identity breaks ties.
        c.ok(#"{"op":"update","model":{"id":"T:4","k":[1,2]}}"#)
        c.ok(#"{"op":"update","model":{"id":"T:5","k":null}}"#)
        c.ok(#"{"op":"update","model":{"id":"T:6","k":[1]}}"#)
        c.ok(#"{"op":"update","model":{"id":"T:7","k":"z"}}"#)
        c.ok(#"{"op":"update","model":{"id":"T:8","k":10}}"#)
        let order = c.ok(#"{"op":"get","query":{"type":"T","order":[{"path":"k"}]}}"#)["items"]?.arrayValue?.compactMap { $0["id"]?.stringValue }
        #expect(order == ["T:1", "T:2", "T:3", "T:5", "T:8", "T:7", "T:6", "T:4"])
    }

    /// After every step of a random sequence of updates, merges, deletes,
    /// batches and nested changes: each query subscription's window (its
    /// subscribe answer with every event's changes applied) equals a naive
    /// re-evaluation — filter, sort, slice — of every entity read back
    /// with `get`, and its last count equals the number of matches.
    @Test(arguments: [1, 2, 3, 4, 5, 6] as [UInt64])
    func windowsEqualANaiveReevaluation(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        let h = EngineHarness()
        let c = h.connect()
        let w = h.connect()
        struct Q {
            let name: String
            let text: String
            let matches: (JSON) -> Bool
            let key: (JSON) -> [JSON?]
            let desc: [Bool]
            let offset: Int
            let limit: Int?
        }
        func at(_ v: JSON, _ path: [String]) -> JSON? {
            var cur: JSON? = v
            for p in path { cur = cur?.objectValue?[p] }
            return cur
        }
        let defs: [Q] = [
            Q(name: "byAuthor", text: #"{"type":"Post","where":{"path":"author.id","eq":"Person:1"},"order":[{"path":"date","desc":true}],"limit":3}"#,
              matches: { at($0, ["author", "id"]) == "Person:1" }, key: { [at($0, ["date"])] }, desc: [true], offset: 0, limit: 3),
            Q(name: "byName", text: #"{"type":"Post","order":[{"path":"author.name"},{"path":"date"}],"offset":2,"limit":4}"#,
              matches: { _ in true }, key: { [at($0, ["author", "name"]), at($0, ["date"])] }, desc: [false, false], offset: 2, limit: 4),
            Q(name: "recent", text: #"{"type":"Post","where":{"all":[{"path":"date","gte":3},{"path":"tag","in":["a","b"]}]},"order":[{"path":"tag"},{"path":"date","desc":true}]}"#,
              matches: { v in
                  guard case .number(let d)? = at(v, ["date"]), (Double(d.text) ?? -1) >= 3 else { return false }
                  return at(v, ["tag"]) == "a" || at(v, ["tag"]) == "b"
              }, key: { [at($0, ["tag"]), at($0, ["date"])] }, desc: [false, true], offset: 0, limit: nil),
            // Filed by the range index (dates are numbers, sometimes fractional, sometimes strings).
            Q(name: "window", text: #"{"type":"Post","where":{"all":[{"path":"date","gt":1},{"path":"date","lte":4.5}]},"order":[{"path":"date"}],"limit":3}"#,
              matches: { v in
                  guard case .number(let d)? = at(v, ["date"]), let x = Double(d.text) else { return false }
                  return x > 1 && x <= 4.5
              }, key: { [at($0, ["date"])] }, desc: [false], offset: 0, limit: 3),
            Q(name: "tagB", text: #"{"type":"Post","where":{"path":"tag","prefix":"b"}}"#,
              matches: { v in
                  guard case .string(let t)? = at(v, ["tag"]) else { return false }
                  return t.hasPrefix("b")
              }, key: { _ in [] }, desc: [], offset: 0, limit: nil),
            Q(name: "noTag", text: #"{"type":"Post","where":{"not":{"path":"tag","exists":true}},"limit":2,"offset":1}"#,
              matches: { at($0, ["tag"]) == nil }, key: { _ in [] }, desc: [], offset: 1, limit: 2),
            // Other pages of the lists above: they share their matches (one tree), each has its window.
            Q(name: "byNameFirst", text: #"{"type":"Post","order":[{"path":"author.name"},{"path":"date"}],"limit":2}"#,
              matches: { _ in true }, key: { [at($0, ["author", "name"]), at($0, ["date"])] }, desc: [false, false], offset: 0, limit: 2),
            Q(name: "windowRest", text: #"{"type":"Post","where":{"all":[{"path":"date","gt":1},{"path":"date","lte":4.5}]},"order":[{"path":"date"}],"offset":3}"#,
              matches: { v in
                  guard case .number(let d)? = at(v, ["date"]), let x = Double(d.text) else { return false }
                  return x > 1 && x <= 4.5
              }, key: { [at($0, ["date"])] }, desc: [false], offset: 3, limit: nil),
            Q(name: "byNameAll", text: #"{"type":"Post","order":[{"path":"author.name"},{"path":"date"}]}"#,
              matches: { _ in true }, key: { [at($0, ["author", "name"]), at($0, ["date"])] }, desc: [false, false], offset: 0, limit: nil),
            Q(name: "noTagAll", text: #"{"type":"Post","where":{"not":{"path":"tag","exists":true}}}"#,
              matches: { at($0, ["tag"]) == nil }, key: { _ in [] }, desc: [], offset: 0, limit: nil),
            Q(name: "byNameFrom5", text: #"{"type":"Post","order":[{"path":"author.name"},{"path":"date"}],"offset":5}"#,
              matches: { _ in true }, key: { [at($0, ["author", "name"]), at($0, ["date"])] }, desc: [false, false], offset: 5, limit: nil),
            // Equality on an array and an object, through the value index.
            Q(name: "labels", text: #"{"type":"Post","where":{"any":[{"path":"labels","eq":["a","b"]},{"path":"labels","in":[{"k":1,"v":"x"}]}]},"order":[{"path":"date"}]}"#,
              matches: { v in
                  let l = at(v, ["labels"])
                  return l == ["a", "b"] || l == .object(JSONObject([.init(key: "k", value: 1), .init(key: "v", value: "x")]))
              }, key: { [at($0, ["date"])] }, desc: [false], offset: 0, limit: nil),
        ] + (0..<9).map { i in
            // Pages of one list, of one to three items, overlapping.
            Q(name: "byNamePage\(i)", text: #"{"type":"Post","order":[{"path":"author.name"},{"path":"date"}],"offset":\#(i),"limit":\#(i % 3 + 1)}"#,
              matches: { _ in true }, key: { [at($0, ["author", "name"]), at($0, ["date"])] }, desc: [false, false], offset: i, limit: i % 3 + 1)
        }
        // Identity order of the reference: code points, as the contract says.
        func less(_ q: Q, _ a: (String, JSON), _ b: (String, JSON)) -> Bool {
            let ka = q.key(a.1), kb = q.key(b.1)
            for i in ka.indices {
                var r = QueryEval.compare(ka[i], kb[i])
                if q.desc[i] { r = -r }
                if r != 0 { return r < 0 }
            }
            return Array(a.0.utf8).lexicographicallyPrecedes(Array(b.0.utf8))
        }
        var windows: [String: [JSON]] = [:]
        var counts: [String: Int] = [:]
        func post(_ i: Int) -> String {
            var members = [#""id":"Post:\#(i)""#]
            if Bool.random(using: &rng) {
                let date = ["\(Int.random(in: 0..<6, using: &rng))", "4.5", "1.0", "2.5", #""3""#].randomElement(using: &rng)!
                members.append(#""date":\#(date)"#)
            }
            if Int.random(in: 0..<3, using: &rng) > 0 { members.append(#""tag":"\#(["a", "b", "c", "bb", "ab"].randomElement(using: &rng)!)""#) }
            if Int.random(in: 0..<4, using: &rng) > 0 { members.append(#""author":{"id":"Person:\#(Int.random(in: 0..<3, using: &rng))"}"#) }
            if Bool.random(using: &rng) {
                let labels = [#"["a","b"]"#, #"["b","a"]"#, #"["a"]"#, #"{"v":"x","k":1.0}"#, #"{"k":1,"v":"y"}"#].randomElement(using: &rng)!
                members.append(#""labels":\#(labels)"#)
            }
            return "{" + members.joined(separator: ",") + "}"
        }
        func person(_ i: Int) -> String {
            Bool.random(using: &rng) ? #"{"id":"Person:\#(i)","name":"\#(["Ann", "Bob", "Cy"].randomElement(using: &rng)!)"}"# : #"{"id":"Person:\#(i)"}"#
        }
        func randomOp() -> String {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0, 1, 2, 3: return #"{"op":"update","model":\#(post(Int.random(in: 0..<12, using: &rng)))}"#
            case 4: return #"{"op":"update","mode":"merge","model":\#(post(Int.random(in: 0..<12, using: &rng)))}"#
            case 5, 6: return #"{"op":"update","model":\#(person(Int.random(in: 0..<3, using: &rng)))}"#
            case 7: return #"{"op":"delete","id":"Post:\#(Int.random(in: 0..<12, using: &rng))"}"#
            case 8: return #"{"op":"delete","id":"Person:\#(Int.random(in: 0..<3, using: &rng))"}"#
            default:
                let ops = (0..<Int.random(in: 2..<5, using: &rng)).map { _ -> String in
                    Bool.random(using: &rng) ? #"{"op":"update","model":\#(post(Int.random(in: 0..<12, using: &rng)))}"#
                                             : #"{"op":"update","model":\#(person(Int.random(in: 0..<3, using: &rng)))}"#
                }
                return #"{"op":"batch","ops":[\#(ops.joined(separator: ","))]}"#
            }
        }
        for step in 0..<300 {
            // Subscribe each query at a different moment (also to an existing state).
            if step % 12 == 0, step / 12 < defs.count {
                let q = defs[step / 12]
                let r = c.ok(#"{"op":"subscribe","sub":"\#(q.name)","query":\#(q.text)}"#)
                windows[q.name] = r["items"]?.arrayValue ?? []
                counts[q.name] = r["count"]?.numberValue?.intValue ?? -1
            }
            // Now and then a view is dropped and built again at once: the new
            // view is filed while the old one is still being unfiled.
            if step % 17 == 5, let q = defs.filter({ windows[$0.name] != nil }).randomElement(using: &rng) {
                c.ok(#"{"op":"unsubscribe","sub":"\#(q.name)"}"#)
                let r = c.ok(#"{"op":"subscribe","sub":"\#(q.name)","query":\#(q.text)}"#)
                windows[q.name] = r["items"]?.arrayValue ?? []
                counts[q.name] = r["count"]?.numberValue?.intValue ?? -1
            }
            w.ok(randomOp())
            for e in c.take() {
                guard let name = e["sub"]?.stringValue else { continue }
                #expect(e["event"] == "query")
                Self.apply(e["changes"]?.arrayValue ?? [], to: &windows[name, default: []])
                counts[name] = e["count"]?.numberValue?.intValue ?? -1
            }
            // The reference: every post read back, filtered, sorted, sliced.
            var all: [(String, JSON)] = []
            for i in 0..<12 {
                if let v = c.ok(#"{"op":"get","id":"Post:\#(i)"}"#)["model"], v != .null { all.append(("Post:\(i)", v)) }
            }
            for q in defs where windows[q.name] != nil {
                let matching = all.filter { q.matches($0.1) }.sorted { less(q, $0, $1) }
                let end = q.limit.map { min(matching.count, q.offset + $0) } ?? matching.count
                let expected = q.offset < end ? Array(matching[q.offset..<end].map(\.1)) : []
                #expect(windows[q.name]! == expected, "seed \(seed) step \(step) \(q.name)")
                #expect(counts[q.name] == matching.count, "seed \(seed) step \(step) \(q.name) count")
                if windows[q.name]! != expected { return }
            }
        }
    }

    /// A range view is built from the type's entities ordered by its path
    /// (not by testing every entity), kept while a range view on the path
    /// lives and within the entries' budget; without the index (over budget)
    /// the same view is built by testing them all. Same items either way.
    @Test(arguments: [4_000_000, 100])
    func rangeViewsAreBuiltFromTheEntitiesOrderedByTheirPath(budget: Int) {
        var config = EngineConfiguration()
        config.maxQueryEntities = budget
        let h = EngineHarness(configuration: config)
        let c = h.connect()
        // 120 posts: numeric dates (some fractional), string dates, none
        // (110 with a date: the index's entries when the budget allows them).
        var lines: [String] = []
        for i in 0..<120 {
            let date = i % 10 == 0 ? #""d\#(i)""# : (i % 7 == 0 ? "\(i).5" : "\(i)")
            lines.append(i % 13 == 0 ? #"{"op":"update","model":{"id":"Post:\#(i)"}}"# : #"{"op":"update","model":{"id":"Post:\#(i)","date":\#(date)}}"#)
        }
        for l in lines { c.ok(l) }
        let q1 = #"{"type":"Post","where":{"all":[{"path":"date","gte":20},{"path":"date","lt":35}]},"order":[{"path":"date"}]}"#
        let r1 = c.ok(#"{"op":"subscribe","sub":"a","query":\#(q1)}"#)
        // 20…34: 20 and 30 are strings, 26 has no date, 21 and 28 are 21.5 and 28.5.
        let dates1 = (r1["items"]?.arrayValue ?? []).compactMap { $0["date"]?.numberValue.flatMap { Double($0.text) } }
        #expect(dates1 == [21.5, 22, 23, 24, 25, 27, 28.5, 29, 31, 32, 33, 34])
        #expect(h.engine.queries.rangeIndexEntries == (budget > 1000 ? 120 - 10 : 0))
        // Changes after the build move entries; a second view on the path reads them.
        c.ok(#"{"op":"update","model":{"id":"Post:26","date":26}}"#)
        c.ok(#"{"op":"delete","id":"Post:21"}"#)
        c.ok(#"{"op":"update","model":{"id":"Post:200","date":"d2"}}"#)
        let q2 = #"{"type":"Post","where":{"path":"date","prefix":"d"},"order":[{"path":"date"}]}"#
        let r2 = c.ok(#"{"op":"subscribe","sub":"b","query":\#(q2)}"#)
        #expect((r2["items"]?.arrayValue ?? []).compactMap { $0["date"]?.stringValue } == ["d10", "d100", "d110", "d2", "d20", "d30", "d40", "d50", "d60", "d70", "d80", "d90"])
        let q3 = #"{"type":"Post","where":{"path":"date","lte":3}}"#
        let r3 = c.ok(#"{"op":"subscribe","sub":"c","query":\#(q3)}"#)
        #expect(r3["count"] == 3)  // 1, 2, 3 (Post:0 has no date)
        // The index goes with the last range view on its path.
        for s in ["a", "b", "c"] { c.ok(#"{"op":"unsubscribe","sub":"\#(s)"}"#) }
        while h.engine.doDeferredWork(units: 64) {}
        #expect(h.engine.queries.rangeIndexEntries == 0)
        #expect(h.engine.invariantViolations().isEmpty)
    }

    /// The range index's order: numbers before strings, strings by bytes, a
    /// prefix's end above every string it prefixes and below the next one.
    @Test func rangeKeysOrderAsTheIndexNeeds() {
        func c(_ a: RangeKey, _ b: RangeKey) -> Int { RangeKey.compare(a, b) }
        let ab = RangeKey.string("ab", beyond: false), abEnd = RangeKey.string("ab", beyond: true)
        #expect(c(abEnd, .string("abzzz", beyond: false)) == 1)
        #expect(c(.string("abzzz", beyond: false), abEnd) == -1)
        #expect(c(abEnd, .string("ac", beyond: false)) == -1)
        #expect(c(abEnd, ab) == 1)
        #expect(c(ab, abEnd) == -1)
        #expect(c(abEnd, abEnd) == 0)
        #expect(c(.string("a", beyond: false), ab) == -1)
        #expect(c(.string("a", beyond: true), .string("ab", beyond: true)) == 1)
        #expect(c(.number(1e300), .string("", beyond: false)) == -1)
        #expect(c(.start(.string), .string("", beyond: false)) == -1)
        #expect(c(.end(.number), .start(.string)) == -1)
    }
}

/// The handles of queried entities (``Identities``): given back when an
/// entity goes or its type's last view does, given again to new entities,
/// while dropped views are still being unfiled with the old ones.
@Suite struct QueryHandleTests {
    /// The store and the live queries share one table of handles: a
    /// listed entity's handle is its record's; a deleted one's stays only
    /// until the queries have unlisted it; a dropped type's entities keep
    /// their handles as long as the store holds them; `clear` frees all.
    @Test func theStoreAndTheQueriesShareHandles() {
        let h = EngineHarness()
        let w = h.connect()
        let ids = h.engine.store.entities
        #expect(h.engine.queries.identities === ids)
        w.ok(#"{"op":"update","model":{"id":"Post:1","date":1}}"#)
        w.ok(#"{"op":"update","model":{"id":"Post:2","date":2}}"#)
        w.ok(#"{"op":"update","model":{"id":"Note:1","rank":1}}"#)
        #expect(ids.handles == 3 && ids.count == 3 && ids.listed == 0)
        let post1 = ids.find("Post:1")!
        w.ok(#"{"op":"subscribe","sub":"q","query":{"type":"Post","order":[{"path":"date"}]}}"#)
        _ = w.take()
        #expect(ids.listed == 2 && ids.isListed(post1) && !ids.isListed(ids.find("Note:1")!))
        #expect(ids.handles == 3, "listing makes no handle of its own")
        // Deleted: the store lets the record go, the query unlists it, and the handle is free.
        w.ok(#"{"op":"delete","id":"Post:1"}"#)
        #expect(ids.find("Post:1") == nil && ids.count == 2 && ids.listed == 1 && ids.handles == 2)
        // Created again: it gets a handle (the freed one) and the query lists it.
        w.ok(#"{"op":"update","model":{"id":"Post:1","date":3}}"#)
        #expect(ids.find("Post:1") == post1 && ids.isListed(post1) && ids.listed == 2)
        // The type's last view goes: its entities are unlisted (between
        // turns), and keep their handles while the store holds them.
        w.ok(#"{"op":"unsubscribe","sub":"q"}"#)
        while h.engine.doDeferredWork(units: 1) {}
        #expect(ids.listed == 0 && ids.handles == 3 && ids.count == 3)
        #expect(h.engine.queries.memberOf.isEmpty)
        #expect(h.engine.invariantViolations().isEmpty)
        // A view again, then `clear`: nothing is left interned.
        w.ok(#"{"op":"subscribe","sub":"q2","query":{"type":"Note"}}"#)
        #expect(ids.listed == 1)
        w.ok(#"{"op":"clear"}"#)
        #expect(ids.handles == 0 && ids.count == 0 && ids.listed == 0 && ids.capacity == 0)
        #expect(h.engine.invariantViolations().isEmpty)
    }

    @Test(arguments: [11, 12, 13] as [UInt64])
    func handlesGoAndComeBackWhileDroppedViewsUnfile(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        let h = EngineHarness()
        let w = h.connect()
        let viewers = [h.connect(), h.connect()]
        let definitions = [
            #"{"type":"Post","where":{"path":"author.id","eq":"Person:1"},"order":[{"path":"date","desc":true}],"limit":3}"#,
            #"{"type":"Post","where":{"path":"author.id","in":["Person:1","Person:2"]},"order":[{"path":"author.id"},{"path":"date"}]}"#,
            #"{"type":"Post","where":{"all":[{"path":"date","gte":20},{"path":"date","lt":60}]},"order":[{"path":"date"}],"limit":4}"#,
            #"{"type":"Post","where":{"path":"title","prefix":"t"},"offset":1,"limit":2}"#,
            #"{"type":"Note","order":[{"path":"rank","desc":true}],"limit":5}"#,
            #"{"type":"Note","where":{"path":"rank","gt":3}}"#,
        ]
        var subscribed: [Set<Int>] = [[], []]
        for step in 0..<1500 {
            let r = Int.random(in: 0..<100, using: &rng)
            let n = Int.random(in: 0..<12, using: &rng)
            switch r {
            case 0..<30:
                w.ok(#"{"op":"update","model":{"id":"Post:\#(n)","date":\#(Int.random(in: 0..<80, using: &rng)),"title":"t\#(n % 3)","author":{"id":"Person:\#(n % 3)"}}}"#)
            case 30..<45:
                w.ok(#"{"op":"update","model":{"id":"Note:\#(n)","rank":\#(Int.random(in: 0..<8, using: &rng))}}"#)
            case 45..<62:
                _ = w.send(#"{"op":"delete","id":"\#(n % 2 == 0 ? "Post" : "Note"):\#(n)"}"#)
            case 62..<82:
                let v = Int.random(in: 0..<2, using: &rng)
                let d = Int.random(in: 0..<definitions.count, using: &rng)
                if subscribed[v].contains(d) {
                    viewers[v].ok(#"{"op":"unsubscribe","sub":"d\#(d)"}"#)
                    subscribed[v].remove(d)
                } else {
                    viewers[v].ok(#"{"op":"subscribe","sub":"d\#(d)","query":\#(definitions[d])}"#)
                    subscribed[v].insert(d)
                }
            case 82..<92:
                // Dropped views unfile a few memberships at a time, and a
                // dropped type's handles are given back a few at a time:
                // entities go and come back (their handles given again),
                // and views of the type are made again, meanwhile.
                _ = h.engine.doDeferredWork(units: Int.random(in: 1...4, using: &rng))
            default:
                _ = w.send(#"{"op":"get","query":\#(definitions[n % definitions.count])}"#)
            }
            for v in viewers { _ = v.take() }
            _ = w.take()
            if step % 50 == 0 {
                let problems = h.engine.invariantViolations()
                #expect(problems.isEmpty, "seed \(seed) step \(step): \(problems.prefix(3))")
            }
        }
        for (v, subs) in subscribed.enumerated() {
            for d in subs { viewers[v].ok(#"{"op":"unsubscribe","sub":"d\#(d)"}"#) }
        }
        while h.engine.doDeferredWork(units: 7) {}
        #expect(h.engine.invariantViolations().isEmpty)
        #expect(h.engine.queries.types.isEmpty)
        #expect(h.engine.queries.identities.listed == 0)
        #expect(h.engine.queries.memberOf.isEmpty)
    }

    /// The interning table against a plain model: records set and taken
    /// out, handles listed and unlisted in random order; a handle lives
    /// while it holds either, is found by its text, and is never given to
    /// two identities at once.
    @Test func theTableAgreesWithADictionary() {
        var rng = SeededRandom(seed: 5)
        let ids = Identities()
        struct Entry { var handle: UInt32; var record: EntityRecord?; var listed: Bool }
        var reference: [String: Entry] = [:]
        for step in 0..<20_000 {
            // Short identities (held in a String's two words) and long ones.
            let n = Int.random(in: 0..<600, using: &rng)
            let id = n % 3 == 0 ? "Entity:with-a-longer-identity-\(n)" : "E:\(n)"
            if var e = reference[id] {
                #expect(ids.find(id) == e.handle)
                #expect(ids.name(e.handle) == id)
                #expect(ids[id] === e.record && ids.record(e.handle) === e.record)
                #expect(ids.isListed(e.handle) == e.listed)
                switch Int.random(in: 0..<4, using: &rng) {
                case 0:
                    let r = EntityRecord(value: .string(id), children: Children())
                    ids[id] = r
                    e.record = r
                case 1:
                    #expect(ids.removeValue(forKey: id) === e.record)
                    e.record = nil
                case 2 where !e.listed:
                    ids.list(e.handle, slot: 0)
                    e.listed = true
                case 3 where e.listed:
                    ids.unlist(e.handle)
                    e.listed = false
                default:
                    break
                }
                if e.record == nil && !e.listed {
                    reference[id] = nil
                    #expect(ids.find(id) == nil)
                } else {
                    reference[id] = e
                }
            } else {
                #expect(ids.find(id) == nil && ids[id] == nil)
                var e = Entry(handle: 0, record: nil, listed: false)
                if Bool.random(using: &rng) {
                    let r = EntityRecord(value: .string(id), children: Children())
                    ids[id] = r
                    e.record = r
                    e.handle = ids.find(id)!
                } else {
                    e.handle = ids.intern(id)
                    ids.list(e.handle, slot: 0)
                    e.listed = true
                }
                #expect(!reference.values.contains { $0.handle == e.handle }, "step \(step): handle \(e.handle) given twice")
                reference[id] = e
            }
            if step % 1000 == 0 { #expect(ids.violations().isEmpty, "step \(step): \(ids.violations().prefix(3))") }
        }
        #expect(ids.handles == reference.count)
        #expect(ids.count == reference.values.filter { $0.record != nil }.count)
        #expect(Set(ids.keys) == Set(reference.filter { $0.value.record != nil }.keys))
        ids.removeAllRecords()
        #expect(ids.count == 0 && ids.handles == reference.values.filter(\.listed).count)
        ids.unlistAll()
        #expect(ids.handles == 0 && ids.capacity == 0)
        for id in reference.keys { #expect(ids.find(id) == nil) }
    }
}

/// ``Memberships``: an entity's views in one 8-byte entry, or in an overflow
/// list from the second on; checked against a plain model through random
/// appends, removals (the last moving into the hole), rebuilds and views
/// numbered, dropped and numbered again.
@Suite struct MembershipsTests {
    @Test(arguments: [1, 2, 3] as [UInt64])
    func listsFollowAPlainModel(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        let ids = Identities()
        var views: [QueryView] = (0..<6).map {
            QueryView(key: "v\($0)", spec: QuerySpec(type: "T"), condition: nil, identities: ids)
        }
        var m = Memberships()
        for v in views { m.register(v) }
        let handles = 5
        m.grow(to: handles, reserve: handles)
        // The model: per handle, (view, node) in slot order.
        var model: [[(QueryView, Int32)]] = Array(repeating: [], count: handles)
        func check() {
            for h in 0..<handles {
                #expect(m.count(of: UInt32(h)) == model[h].count)
                for (slot, (v, node)) in model[h].enumerated() {
                    let got = m[UInt32(h), slot]
                    #expect(got.view === v && got.node == node, "handle \(h) slot \(slot)")
                }
            }
            #expect(m.registered == views.count)
        }
        for step in 0..<3000 {
            let h = Int.random(in: 0..<handles, using: &rng)
            switch Int.random(in: 0..<10, using: &rng) {
            case 0..<4:
                let v = views.randomElement(using: &rng)!
                let node = Int32(step)
                #expect(m.append(UInt32(h), Membership(view: v, node: node)) == Int32(model[h].count))
                model[h].append((v, node))
            case 4..<7:
                guard !model[h].isEmpty else { continue }
                let slot = Int.random(in: 0..<model[h].count, using: &rng)
                let moved = m.remove(UInt32(h), at: slot)
                let last = model[h].removeLast()
                if slot < model[h].count {
                    model[h][slot] = last
                    #expect(moved?.view === last.0 && moved?.node == last.1)
                } else {
                    #expect(moved == nil)
                }
            case 7:
                // An update's rebuild: emptied, appended again, trimmed.
                m.empty(UInt32(h))
                let again = model[h].filter { _ in Bool.random(using: &rng) }
                model[h] = []
                for (v, node) in again {
                    #expect(m.append(UInt32(h), Membership(view: v, node: node)) == Int32(model[h].count))
                    model[h].append((v, node))
                }
                m.trim(UInt32(h))
            case 8:
                m.clear(UInt32(h))
                model[h] = []
            default:
                // A view no list holds any more gives its number back; a new one takes it.
                let held = Set(model.flatMap { $0.map { ObjectIdentifier($0.0) } })
                guard let i = views.indices.first(where: { !held.contains(ObjectIdentifier(views[$0])) }) else { continue }
                m.unregister(views[i])
                #expect(views[i].membershipNumber == -1)
                views[i] = QueryView(key: "n\(step)", spec: QuerySpec(type: "T"), condition: nil, identities: ids)
                m.register(views[i])
            }
            check()
        }
    }
}
