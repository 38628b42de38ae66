import ConcordJSON
import Synchronization
import Testing

@testable import ConcordCore

/// Entities an update creates hold the stored values of the entities it
/// carries along unchanged — one copy of an author however many new posts
/// hold it — and no written entity's bytes change for it
/// (`Store.shareCarriedAlong`).
struct SharedValuesTests {
    func members(_ h: EngineHarness, _ id: String) -> [JSONObject.Member] {
        guard case .object(let o)? = h.engine.store.entity(id) else { return [] }
        return o.members
    }

    func nested(_ h: EngineHarness, _ id: String, _ member: String) -> [JSONObject.Member] {
        guard case .object(let o)? = h.engine.store.entity(id), case .object(let a)? = o[member] else { return [] }
        return a.members
    }

    @Test func newPostsHoldTheStoredAuthor() {
        let h = EngineHarness()
        let w = h.connect()
        w.ok(#"{"op":"update","model":{"id":"U:1","name":"Ann","n":1.50}}"#)
        for i in 0..<3 {
            w.ok(#"{"op":"update","model":{"id":"P:\#(i)","author":{"id":"U:1","name":"Ann","n":1.50},"i":\#(i)}}"#)
        }
        let author = members(h, "U:1")
        #expect(!author.isEmpty)
        for i in 0..<3 { #expect(sameBuffer(nested(h, "P:\(i)", "author"), author), "P:\(i)") }
        // The bytes are the request's.
        #expect(w.ok(#"{"op":"get","id":"P:1"}"#)["model"]?.compactString == #"{"id":"P:1","author":{"id":"U:1","name":"Ann","n":1.50},"i":1}"#)
        // A change of the author reaches every post (one value, refreshed in each).
        w.ok(#"{"op":"update","model":{"id":"U:1","name":"Bo","n":1.50}}"#)
        for i in 0..<3 { #expect(h.engine.store.entity("P:\(i)")?["author"]?["name"] == "Bo") }
        #expect(h.engine.store.invariantViolations().isEmpty)
    }

    @Test func anAuthorSpelledOtherwiseKeepsItsSpelling() {
        let h = EngineHarness()
        let w = h.connect()
        w.ok(#"{"op":"update","model":{"id":"U:1","name":"Ann","n":1.50}}"#)
        // Equal to the stored author (member order and a number's spelling
        // are not part of equality), so unchanged; but not spelled alike.
        w.ok(#"{"op":"update","model":{"id":"P:1","author":{"name":"Ann","id":"U:1","n":1.5}}}"#)
        w.ok(#"{"op":"update","model":{"id":"P:2","author":{"id":"U:1","name":"Ann","n":1.5}}}"#)
        #expect(!sameBuffer(nested(h, "P:1", "author"), members(h, "U:1")))
        #expect(!sameBuffer(nested(h, "P:2", "author"), members(h, "U:1")))
        #expect(w.ok(#"{"op":"get","id":"P:1"}"#)["model"]?.compactString == #"{"id":"P:1","author":{"name":"Ann","id":"U:1","n":1.5}}"#)
        #expect(w.ok(#"{"op":"get","id":"P:2"}"#)["model"]?.compactString == #"{"id":"P:2","author":{"id":"U:1","name":"Ann","n":1.5}}"#)
        #expect(w.ok(#"{"op":"get","id":"U:1"}"#)["model"]?.compactString == #"{"id":"U:1","name":"Ann","n":1.50}"#)
    }

    @Test func aChainSharesFromTheBottomUp() {
        let h = EngineHarness()
        let w = h.connect()
        w.ok(#"{"op":"update","model":{"id":"U:1","name":"Ann"}}"#)
        // P:1 and C:1 are new, U:1 is carried along inside C:1, inside a plain list.
        w.ok(#"{"op":"update","model":{"id":"P:1","thread":[{"id":"C:1","text":"x","by":{"id":"U:1","name":"Ann"}}],"tags":["a"]}}"#)
        #expect(sameBuffer(nested(h, "C:1", "by"), members(h, "U:1")))
        guard case .array(let thread)? = h.engine.store.entity("P:1")?["thread"], case .object(let c)? = thread.first else {
            Issue.record("P:1 has no thread")
            return
        }
        #expect(sameBuffer(c.members, members(h, "C:1")))
        #expect(w.ok(#"{"op":"get","id":"P:1"}"#)["model"]?.compactString
            == #"{"id":"P:1","thread":[{"id":"C:1","text":"x","by":{"id":"U:1","name":"Ann"}}],"tags":["a"]}"#)
        #expect(h.engine.store.invariantViolations().isEmpty)
    }

    @Test func aKeyedDocumentsEventIsStillSplicedFromTheRequest() {
        let h = EngineHarness()
        let w = h.connect()
        let s = h.connect()
        w.ok(#"{"op":"update","model":{"id":"U:1","name":"Ann"}}"#)
        s.ok(#"{"op":"subscribe","sub":"k","key":"k"}"#)
        let spliced = h.engine.splicedValues.load(ordering: .relaxed)
        let model = #"{"id":"D:1","title":"t","author":{"id":"U:1","name":"Ann"}}"#
        w.ok(#"{"op":"update","key":"k","model":\#(model)}"#)
        #expect(sameBuffer(nested(h, "D:1", "author"), members(h, "U:1")))
        let events = s.take()
        #expect(events.count == 1)
        #expect(events.first?["model"]?.compactString == model)
        #expect(h.engine.splicedValues.load(ordering: .relaxed) > spliced)
    }
}
