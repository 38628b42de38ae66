import Testing

@testable import ConcordCore

/// `ConnectionMap` against a `Dictionary` through random inserts, updates
/// and removals — numbers in a small range (long probe runs, removals in
/// the middle of them), spread ones, negative ones — with every lookup,
/// the count, and the iterated pairs, keys and values compared after each
/// step; then emptied one by one (the table shrinking under them).
struct ConnectionMapTests {
    @Test func agreesWithADictionary() {
        var rng = SplitMix(seed: 71)
        for pool in [[Int](0..<12), (0..<40).map { $0 * 1024 }, (0..<40).map { -$0 * 7 - 1 }, (0..<200).map { $0 * 37 }, (0..<600).map { $0 * 3 }] {
            var map = ConnectionMap<Int>()
            var model: [Int: Int] = [:]
            for step in 0..<3000 {
                let id = pool[rng.next() % pool.count]
                switch rng.next() % 3 {
                case 0, 1:
                    map[id] = step
                    model[id] = step
                default:
                    #expect(map.removeValue(forKey: id) == model.removeValue(forKey: id))
                }
                #expect(map.count == model.count)
                #expect(map.isEmpty == model.isEmpty)
                if step % 50 == 0 || pool.count <= 12 {
                    for p in pool { #expect(map[p] == model[p]) }
                    let pairs = Array(map)
                    #expect(pairs.count == model.count)
                    #expect(Dictionary(uniqueKeysWithValues: pairs.map { ($0.key, $0.value) }) == model)
                    #expect(Set(map.keys) == Set(model.keys))
                    #expect(map.values.sorted() == model.values.sorted())
                }
            }
            // Emptied one by one: the table halves on the way down and keeps finding the rest.
            var order = pool
            for i in order.indices.reversed() { order.swapAt(i, rng.next() % (i + 1)) }
            for id in order {
                #expect(map.removeValue(forKey: id) == model.removeValue(forKey: id))
                #expect(map.count == model.count)
                if id % 3 == 0 { for p in pool { #expect(map[p] == model[p]) } }
            }
            #expect(map.isEmpty && Array(map).isEmpty)
            for id in pool { map[id] = id }
            map.removeAll()
            #expect(map.isEmpty && map[pool[0]] == nil && Array(map).isEmpty)
        }
        let literal: ConnectionMap<String> = [3: "c", 1: "a"]
        #expect(literal[1] == "a" && literal[3] == "c" && literal[2] == nil && literal.count == 2)
    }
}
