import ConcordJSON
import Testing

@testable import ConcordCore

/// A key's document whose model is an entity is that entity's stored value
/// (the store reads it from the entity's record, `Store.apply`). When the
/// key is written again with another entity, or with a document that is not
/// an entity, what the document holds — and so which later updates reach
/// the key's subscribers — follows the new value.
struct KeyDocumentRootTests {
    @Test func theDocumentFollowsWhicheverEntityWasWrittenLast() {
        let h = EngineHarness()
        let w = h.connect(), s = h.connect()
        w.ok(#"{"op":"update","key":"k","model":{"id":"A:1","n":1}}"#)
        #expect(s.ok(#"{"op":"subscribe","sub":"d","key":"k"}"#)["model"] == json(#"{"id":"A:1","n":1}"#))

        // Another entity under the same key.
        w.ok(#"{"op":"update","key":"k","model":{"id":"B:1","n":1}}"#)
        var ev = s.take()
        #expect(ev.count == 1)
        #expect(ev.first?["model"] == json(#"{"id":"B:1","n":1}"#))

        // A:1 is no longer in the document: its change reaches nobody.
        w.ok(#"{"op":"update","model":{"id":"A:1","n":2}}"#)
        #expect(s.take().isEmpty)

        // B:1 is: its change rewrites the document.
        w.ok(#"{"op":"update","model":{"id":"B:1","n":2}}"#)
        ev = s.take()
        #expect(ev.count == 1)
        #expect(ev.first?["model"] == json(#"{"id":"B:1","n":2}"#))
        #expect(ev.first?["changed"] == ["B:1"])

        // The same entity again, unchanged: nothing is sent.
        w.ok(#"{"op":"update","key":"k","model":{"id":"B:1","n":2}}"#)
        #expect(s.take().isEmpty)

        // Back to A:1, whose stored value is the document (n 3, as written).
        w.ok(#"{"op":"update","key":"k","model":{"id":"A:1","n":3}}"#)
        ev = s.take()
        #expect(ev.first?["model"] == json(#"{"id":"A:1","n":3}"#))
        w.ok(#"{"op":"update","model":{"id":"B:1","n":4}}"#)
        #expect(s.take().isEmpty)
    }

    @Test func anEntityDocumentAndAPlainOneReplaceEachOther() {
        let h = EngineHarness()
        let w = h.connect(), s = h.connect()
        w.ok(#"{"op":"update","key":"k","model":{"items":[{"id":"A:1","n":1}]}}"#)
        s.ok(#"{"op":"subscribe","sub":"d","key":"k"}"#)
        #expect(s.take().isEmpty)
        w.ok(#"{"op":"update","key":"k","model":{"id":"A:1","n":1}}"#)
        var ev = s.take()
        #expect(ev.first?["model"] == json(#"{"id":"A:1","n":1}"#))
        w.ok(#"{"op":"update","model":{"id":"A:1","n":2}}"#)
        ev = s.take()
        #expect(ev.first?["model"] == json(#"{"id":"A:1","n":2}"#))
        w.ok(#"{"op":"update","key":"k","model":{"title":"plain"}}"#)
        ev = s.take()
        #expect(ev.first?["model"] == json(#"{"title":"plain"}"#))
        w.ok(#"{"op":"update","model":{"id":"A:1","n":3}}"#)
        #expect(s.take().isEmpty)
    }

    @Test func aMergedRootIsTheDocumentAsStored() {
        let h = EngineHarness()
        let w = h.connect(), s = h.connect()
        w.ok(#"{"op":"update","key":"k","model":{"id":"A:1","n":1,"m":1}}"#)
        s.ok(#"{"op":"subscribe","sub":"d","key":"k"}"#)
        #expect(s.take().isEmpty)
        w.ok(#"{"op":"update","key":"k","mode":"merge","model":{"id":"A:1","n":2}}"#)
        let ev = s.take()
        #expect(ev.first?["model"] == json(#"{"id":"A:1","n":2,"m":1}"#))
    }
}
