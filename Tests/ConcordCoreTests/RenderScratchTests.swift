import ConcordJSON
import Testing

@testable import ConcordCore

/// The map step's per-job scratch (`RenderResults`): a job's writer buffer
/// and short-payload block are kept for the next mutation's job of the same
/// index, a block still held elsewhere is never written over, and the
/// memory kept is bounded.
struct RenderScratchTests {
    @Test func aBlockIsReusedOnlyWhenNothingHoldsIt() {
        let r = RenderResults(count: 0)
        r.reset(count: 3)
        // Identities only: a reference kept here would be a holder.
        let a = ObjectIdentifier(r.smallBlock(1))
        #expect(ObjectIdentifier(r.smallBlock(1)) == a, "nothing else holds it: the same block")
        var held: [OutputBytes] = [r.smallBlock(1)]
        let b = ObjectIdentifier(r.smallBlock(1))
        #expect(b != a, "held by a queue: a new block")
        #expect(ObjectIdentifier(held[0]) == a)
        held.removeAll()
        #expect(ObjectIdentifier(r.smallBlock(1)) == b)
        #expect(ObjectIdentifier(r.smallBlock(0)) != b, "one block per index")
    }

    @Test func buffersAreKeptPerIndexWithinBounds() {
        let r = RenderResults(count: 0)
        r.reset(count: RenderResults.scratchKept + 10)
        var small = [UInt8](repeating: 7, count: 100)
        r.keepBuffer(5, &small, limit: 1024)
        let back = r.takeBuffer(5)
        #expect(back.isEmpty && back.capacity >= 100, "kept emptied, with its capacity")
        #expect(r.takeBuffer(5).capacity == 0, "taken: nothing left until it is kept again")
        var big = [UInt8](repeating: 1, count: 5000)
        r.keepBuffer(6, &big, limit: 1024)
        #expect(r.takeBuffer(6).capacity == 0, "past the limit: not kept")
        var far = [UInt8](repeating: 1, count: 10)
        r.keepBuffer(RenderResults.scratchKept + 3, &far, limit: 1024)
        #expect(r.takeBuffer(RenderResults.scratchKept + 3).capacity == 0, "past the kept indices: nothing kept")
        #expect(r.smallBlock(RenderResults.scratchKept + 3) !== r.smallBlock(RenderResults.scratchKept + 3))
    }

    /// Many jobs in one mutation, mutation after mutation: every subscriber
    /// gets its own view's bytes (a reused block or buffer written over
    /// while still needed would show here as another view's value).
    @Test func manyJobsGetTheirOwnBytesMutationAfterMutation() {
        let h = EngineHarness()
        let a = h.connect(), w = h.connect()
        for i in 0..<40 { a.ok(#"{"op":"subscribe","sub":"m\#(i)","model":{"viewer":\#(i),"e":{"id":"E:1","v":0}}}"#) }
        for v in 1...5 {
            w.ok(#"{"op":"update","model":{"id":"E:1","v":\#(v)}}"#)
            let got = a.take()
            #expect(got.count == 40)
            for e in got {
                let name = e["sub"]?.stringValue ?? ""
                #expect(e["model"]?["viewer"]?.numberValue?.intValue == Int(name.dropFirst()))
                #expect(e["model"]?["e"]?["v"]?.numberValue?.intValue == v)
            }
        }
    }
}
