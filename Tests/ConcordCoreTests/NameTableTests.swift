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
        // 7/8 of 2^17: the most that fits before it doubles.
        for i in 0..<114_688 { table.insert(Item("k\(i)", i)) }
        #expect(table.count == 114_688)
        #expect(table.capacity == 1 << 17)
        table.insert(Item("k114688", 114_688))
        #expect(table.capacity == 1 << 18)
        for i in stride(from: 0, to: 114_689, by: 7) { #expect(table["k\(i)"]?.tag == i) }
    }

    /// Removals leave tombstones; churn at a steady size must reuse or
    /// clear them, not grow the table or slow lookups without bound.
    @Test func churnAtASteadySizeKeepsItsCapacity() {
        var table = NameTable<Item>()
        for i in 0..<1000 { table.insert(Item("k\(i)", i)) }
        let capacity = table.capacity
        for i in 1000..<200_000 {
            #expect(table.removeValue(forKey: "k\(i - 1000)")?.tag == i - 1000)
            table.insert(Item("k\(i)", i))
        }
        #expect(table.count == 1000)
        #expect(table.capacity <= capacity * 2)
        for i in 199_000..<200_000 { #expect(table["k\(i)"]?.tag == i) }
        #expect(table["k0"] == nil)
    }

    /// A copy is a value: changing one leaves the other as it was.
    @Test func copiesAreValues() {
        var a = NameTable<Item>()
        for i in 0..<100 { a.insert(Item("k\(i)", i)) }
        var b = a
        b.removeValue(forKey: "k1")
        b.insert(Item("k2", -2))
        b.insert(Item("new", 7))
        #expect(a.count == 100 && a["k1"]?.tag == 1 && a["k2"]?.tag == 2 && a["new"] == nil)
        #expect(b.count == 100 && b["k1"] == nil && b["k2"]?.tag == -2 && b["new"]?.tag == 7)
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
