import Testing

@testable import ConcordCore

/// NameTable against a Dictionary, under random inserts, replacements and
/// removals (backward-shift deletion, growth and shrinking included).
struct NameTableTests {
    final class Item: Named {
        let tableName: String
        let tag: Int
        init(_ name: String, _ tag: Int) {
            tableName = name
            self.tag = tag
        }
    }

    @Test func agreesWithADictionary() {
        var rng = SplitMix(seed: 42)
        var table = NameTable<Item>()
        var model: [String: Int] = [:]
        for step in 0..<60_000 {
            // A small name space makes collisions, replacements and long probe runs common.
            let name = "n\(rng.next() % 3000)"
            switch rng.next() % 10 {
            case 0...5:
                table[name] = Item(name, step)
                model[name] = step
            default:
                let removed = table.removeValue(forKey: name)
                #expect(removed?.tag == model.removeValue(forKey: name))
            }
            if step % 997 == 0 {
                #expect(table.count == model.count)
                for (k, v) in model { #expect(table[k]?.tag == v) }
                #expect(Set(table.values.map(\.tableName)) == Set(model.keys))
            }
        }
        for k in Array(model.keys) {
            #expect(table.removeValue(forKey: k)?.tag == model[k])
        }
        #expect(table.isEmpty)
        #expect(table.capacity <= 8, "shrinks when emptied")
        #expect(table["n1"] == nil)
    }

    @Test func growsWithinItsLoadFactor() {
        var table = NameTable<Item>()
        // 3/4 of 2^17: the most that fits before it doubles.
        for i in 0..<98_304 { table.insert(Item("k\(i)", i)) }
        #expect(table.count == 98_304)
        #expect(table.capacity == 1 << 17)
        table.insert(Item("k98304", 98_304))
        #expect(table.capacity == 1 << 18)
        for i in stride(from: 0, to: 98_305, by: 7) { #expect(table["k\(i)"]?.tag == i) }
    }
}

/// A small deterministic generator (tests must not depend on the seed of the run).
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> Int {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return Int(truncatingIfNeeded: (z ^ (z >> 31)) >> 1)
    }
}
