import ConcordJSON
import Testing

@testable import ConcordCore

/// `Children` against a list of `(identity, count)` pairs in order of first
/// occurrence: one identity held once (kept inline), held twice, several,
/// and past 16 (with an index); identities that differ only in their bytes
/// ("é" composed and decomposed) are two entities, as in the store's tables;
/// a scratch list emptied and refilled gives the same lists as a new one.
struct ChildrenTests {
    @Test func agreesWithAListOfPairs() {
        var rng = SplitMix(seed: 19)
        var scratch = Children()
        for size in [1, 2, 3, 16, 17, 40] {
            for round in 0..<20 {
                var ids = (0..<size).map { "E:\($0)" }
                if round % 2 == 1 { ids += ["P:\u{E9}", "P:e\u{301}"] }
                let adds = round % 5 == 0 ? 1 : rng.next() % (size * 3) + 1
                var children = Children()
                var index: Children.Index? = nil
                var scratchIndex: Children.Index? = nil
                scratch.removeAll()
                var model: [(id: String, count: Int)] = []
                for _ in 0..<adds {
                    let id = ids[rng.next() % ids.count]
                    children.add(id, index: &index)
                    scratch.add(id, index: &scratchIndex)
                    if let i = model.firstIndex(where: { Array($0.id.utf8) == Array(id.utf8) }) {
                        model[i].count += 1
                    } else {
                        model.append((id, 1))
                    }
                }
                #expect(children.count == model.count)
                #expect(!children.isEmpty)
                let listed = Array(children)
                #expect(listed.map(\.id) == model.map(\.id))
                #expect(listed.map { Array($0.id.utf8) } == model.map { Array($0.id.utf8) })
                #expect(listed.map(\.count) == model.map(\.count))
                #expect(Array(children.keys).map { Array($0.utf8) } == model.map { Array($0.id.utf8) })
                for id in ids {
                    let entry = model.first { Array($0.id.utf8) == Array(id.utf8) }
                    #expect(children.contains(id) == (entry != nil))
                    #expect(children.isOnly(id) == (model.count == 1 && entry?.count == 1))
                }
                #expect(children == scratch)
                #expect(children.copied() == children)
                #expect(scratch.copied() == children)
                var other = children.copied()
                var otherIndex: Children.Index? = nil
                other.add(ids[0], index: &otherIndex)
                #expect(other != children)
            }
        }
        #expect(Children().isEmpty)
        #expect(Children() == Children())
        #expect(Children("A:1") != Children())
        #expect(Children("A:1").isOnly("A:1"))
    }
}
