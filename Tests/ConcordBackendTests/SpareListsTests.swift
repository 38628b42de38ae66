import Testing

@testable import ConcordServer

/// The lists the loop and the sequencer give back to each other are
/// bounded: a burst's big lists are freed, not kept, and no side keeps more
/// than `maxLists` of a kind (memory bounded by the constants, never by
/// what clients sent).
struct SpareListsTests {
    @Test func keepsEmptiedListsWithinTheBounds() {
        var kept: [[Int]] = []
        var big = [Int](repeating: 7, count: SpareLists.maxCapacity + 1)
        SpareLists.keep(&big, in: &kept)
        #expect(kept.isEmpty, "a list with room for more than maxCapacity is let go")
        var none: [Int] = []
        SpareLists.keep(&none, in: &kept)
        #expect(kept.isEmpty, "a list without storage is not worth keeping")
        for i in 0..<(SpareLists.maxLists + 5) {
            var l = [1, 2, 3]
            SpareLists.keep(&l, in: &kept)
            // Kept: emptied into `kept`. Past the bound: left to its owner, who drops it.
            #expect(l.isEmpty == (i < SpareLists.maxLists))
        }
        #expect(kept.count == SpareLists.maxLists)
        #expect(kept.allSatisfy { $0.isEmpty && $0.capacity >= 3 })
    }

    @Test func givesListsOnWithinTheBound() {
        var from: [[Int]] = (0..<10).map { _ in [Int](repeating: 0, count: 0) }
        var to: [[Int]] = []
        SpareLists.give(&from, to: &to)
        #expect(from.isEmpty && to.count == 10)
        from = (0..<(SpareLists.maxLists)).map { _ in [] }
        SpareLists.give(&from, to: &to)
        #expect(to.count == SpareLists.maxLists, "the receiving side holds at most maxLists")
        #expect(from.isEmpty, "what does not fit is freed, not left behind")
    }
}
