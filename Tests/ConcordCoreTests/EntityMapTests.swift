import ConcordJSON
import Testing

@testable import ConcordCore

/// `EntityMap` against a list of pairs: order of first addition, the last
/// value of a repeated identity, lookups by identity and by place — in its
/// short form (searched in place) and past 16 entries (with an index), and
/// identities that differ only in their bytes ("é" composed and not) kept
/// apart in both, as the store's tables keep them.
struct EntityMapTests {
    @Test func agreesWithAListOfPairs() {
        var rng = SplitMix(seed: 33)
        for size in [1, 5, 16, 17, 40] {
            var map = EntityMap()
            var model: [(String, JSON)] = []
            var ids = (0..<size).map { "E:\($0)" }
            ids += ["\u{E9}", "e\u{301}"]
            for step in 0..<(size * 3) {
                let id = ids[Int(rng.next()) % ids.count]
                let value = JSON.int(step)
                let isNew = map.set(id, value)
                if let i = model.firstIndex(where: { Array($0.0.utf8) == Array(id.utf8) }) {
                    #expect(!isNew)
                    model[i].1 = value
                } else {
                    #expect(isNew)
                    model.append((id, value))
                }
            }
            #expect(map.count == model.count)
            for (i, (id, value)) in model.enumerated() {
                #expect(map.id(at: i) == id)
                #expect(map.index(of: id) == i)
                #expect(map[id] == value)
                #expect(map.contains(id))
            }
            #expect(!map.contains("absent"))
            #expect(Array(map.ids) == model.map(\.0))
        }
    }
}
