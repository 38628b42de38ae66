import ConcordTestSupport
import Testing

@testable import ConcordCore

/// IDTable against a Dictionary under random inserts, replacements and
/// removals (backward-shift deletion, the dense arrays' moves, growth and
/// shrinking included), and IDSet on top of it.
struct IDTableTests {
    /// A small string is hashed from its two words: the same value as from
    /// its bytes, for every length, ASCII or not, and for the same text held
    /// as a native (heap) string — else one identity would file in two places.
    @Test func aTextHashesAlikeHoweverItIsHeld() {
        var rng = SystemRandomNumberGenerator()
        let alphabet = Array("az09:_-é€".unicodeScalars)
        for n in 0...40 {
            for _ in 0..<20 {
                let text = String(String.UnicodeScalarView((0..<n).map { _ in alphabet.randomElement(using: &rng)! }))
                var native = text
                native.reserveCapacity(64)
                let bytes = Array(text.utf8)
                for seed: UInt64 in [IDHash.seed, 1, 0x1234_5678_9ABC_DEF1] {
                    let expected = bytes.withUnsafeBytes { IDHash.of($0, seed: seed) }
                    #expect(IDHash.of(text, seed: seed) == expected, "\(text.debugDescription)")
                    #expect(IDHash.of(native, seed: seed) == expected, "\(text.debugDescription) (native)")
                }
            }
        }
    }

    @Test func agreesWithADictionary() {
        var rng = SplitMix(seed: 7)
        var table = IDTable<Int>()
        var model: [String: Int] = [:]
        // Few distinct names, so removals and re-insertions are frequent;
        // lengths across the 8-byte words and small/large strings.
        let names = (0..<600).map { i in String(repeating: "p", count: i % 23) + "E:\(i)" }
        var maxCapacity = 0
        for step in 0..<60_000 {
            let name = names[rng.next() % (step < 30_000 ? names.count : 40)]
            switch rng.next() % 7 {
            case 0, 1, 2:
                let v = rng.next()
                #expect(table.updateValue(v, forKey: name) == model.updateValue(v, forKey: name))
            case 3:
                #expect(table.insert(name, -1) == (model[name] == nil))
                if model[name] == nil { model[name] = -1 }
            case 4, 5:
                #expect(table.removeValue(forKey: name) == model.removeValue(forKey: name))
            default:
                #expect(table[name] == model[name])
                #expect(table.contains(name) == (model[name] != nil))
            }
            maxCapacity = max(maxCapacity, table.capacity)
            if step % 5000 == 0 {
                #expect(table.count == model.count)
                for (k, v) in table { #expect(model[k] == v) }
            }
        }
        #expect(table.count == model.count)
        #expect(Dictionary(uniqueKeysWithValues: table.map { ($0.key, $0.value) }) == model)
        for n in names { #expect(table[n] == model[n]) }
        // It grew for the many, and shrank again for the few.
        #expect(maxCapacity >= 1024)
        #expect(table.capacity <= 8 * max(model.count, 8))
    }

    /// A few names in a small table: probe runs wrap around the end of the
    /// slots, which backward-shift deletion has to handle.
    @Test func smallTablesWrapAround() {
        var rng = SplitMix(seed: 3)
        var table = IDTable<Int>()
        var model: [String: Int] = [:]
        let names = (0..<7).map { "w\($0)" }
        for _ in 0..<40_000 {
            let name = names[rng.next() % names.count]
            if rng.next() % 2 == 0 {
                #expect(table.updateValue(1, forKey: name) == model.updateValue(1, forKey: name))
            } else {
                #expect(table.removeValue(forKey: name) == model.removeValue(forKey: name))
            }
            for n in names where table.contains(n) != (model[n] != nil) {
                Issue.record("\(n) lost after an operation")
            }
        }
    }

    @Test func copiesAreValues() {
        var a = IDTable<Int>()
        for i in 0..<100 { a.updateValue(i, forKey: "k\(i)") }
        var b = a
        b.removeValue(forKey: "k1")
        b.updateValue(-5, forKey: "k2")
        b.updateValue(7, forKey: "new")
        #expect(a.count == 100 && a["k1"] == 1 && a["k2"] == 2 && a["new"] == nil)
        #expect(b.count == 100 && b["k1"] == nil && b["k2"] == -5 && b["new"] == 7)
        var c = a
        c.removeAll(keepingCapacity: true)
        #expect(c.isEmpty && c["k3"] == nil && a["k3"] == 3)
        var s1: IDSet = ["a", "b", "c"]
        let s2 = s1
        s1.insert("d")
        #expect(s2.count == 3 && !s2.contains("d") && s1.contains("d"))
    }

    /// An unshared table is changed in place: no copy per insertion (a
    /// binding of the storage before the uniqueness check made every
    /// change copy the whole table, ~1 s a thousand entries later), and a
    /// table shared with an iterator is copied once, then changed in place.
    @Test func anUnsharedTableIsChangedInPlace() {
        var t = IDTable<Int>()
        t.updateValue(0, forKey: "first")
        let id = t.storageIdentity
        for i in 0..<3 {
            t.updateValue(i, forKey: "first")
            t.insert("k\(i)", i)
            t.modify("k\(i)", default: 0) { $0 += 1; return true }
            t.removeValue(forKey: "k\(i)")
            #expect(t.storageIdentity == id)
        }
        var it: IDTable<Int>.Iterator? = t.makeIterator()
        t.insert("while iterated", 1)
        let copied = t.storageIdentity
        #expect(copied != id)
        t.insert("again", 2)
        #expect(t.storageIdentity == copied)
        #expect(it?.next()?.key == "first" && it?.next() == nil)
        it = nil
    }

    @Test func iterationIsInsertionOrderWithoutRemovals() {
        var table = IDTable<Int>()
        for i in 0..<1000 { table.updateValue(i, forKey: "k\(i)") }
        #expect(table.map(\.value) == Array(0..<1000))
        var set = IDSet()
        for i in (0..<50).reversed() { set.insert("s\(i)") }
        #expect(Array(set) == (0..<50).reversed().map { "s\($0)" })
    }

    @Test func idSetAgreesWithASet() {
        var rng = SplitMix(seed: 11)
        var a = IDSet(), b = IDSet()
        var sa: Set<String> = [], sb: Set<String> = []
        for _ in 0..<3000 {
            let n = "E:\(rng.next() % 300)"
            if rng.next() % 2 == 0 {
                #expect(a.insert(n).inserted == sa.insert(n).inserted)
            } else {
                #expect(b.insert(n).inserted == sb.insert(n).inserted)
            }
        }
        #expect(Set(a) == sa && a.count == sa.count)
        #expect(Set(a.union(b)) == sa.union(sb))
        for i in 0..<300 { #expect(a.contains("E:\(i)") == sa.contains("E:\(i)")) }
        #expect(a == IDSet(sa) && a != b)
    }

    /// `ChangeSet`: members appended unhashed (`insertNew`, what
    /// propagation does for the referrers it refreshes) mixed with hashed
    /// inserts, lookups and hashed copies: the same members as a `Set`, in
    /// insertion order, however the two kinds of insert interleave.
    @Test(arguments: [3, 4, 5] as [UInt64])
    func changeSetAgreesWithASet(seed: UInt64) {
        var rng = SplitMix(seed: seed)
        var set = ChangeSet()
        var model: Set<String> = []
        var order: [String] = []
        var fresh = 0
        var copies: [(ChangeSet, [String])] = []
        for step in 0..<4000 {
            switch rng.next() % 8 {
            case 0, 1, 2:
                // New to the set: a name never used.
                fresh += 1
                let n = fresh % 3 == 0 ? "Post:a-longer-identity-than-fifteen-\(fresh)" : "N:\(fresh)"
                set.insertNew(n)
                model.insert(n)
                order.append(n)
            case 3, 4:
                // Maybe a member already: hashed.
                let n = rng.next() % 2 == 0 && !order.isEmpty ? order[rng.next() % order.count] : "O:\(rng.next() % 500)"
                let inserted = set.insert(n).inserted
                #expect(inserted == model.insert(n).inserted)
                if inserted { order.append(n) }
            case 5:
                let n = rng.next() % 2 == 0 && !order.isEmpty ? order[rng.next() % order.count] : "O:\(rng.next() % 500)"
                #expect(set.contains(n) == model.contains(n))
            case 6:
                let all = set.asIDSet
                #expect(Array(all) == order && all.count == model.count)
                if let h = set.hashed(forLookups: rng.next() % 40) {
                    #expect(set.unhashedCount > 8 && Array(h) == order)
                }
                if step % 50 == 0 { copies.append((set, order)) }
            default:
                if rng.next() % 100 == 0 { set.hashAll() }
            }
            #expect(set.count == model.count)
        }
        #expect(Array(set) == order)
        for n in order { #expect(set.contains(n)) }
        #expect(!set.contains("never") && set == ChangeSet(order) && Set(set.union(["x"])) == model.union(["x"]))
        // A copy is a value: what was added after it is not in it.
        for (copy, snapshot) in copies {
            #expect(Array(copy) == snapshot)
            if snapshot.count < order.count { #expect(!copy.contains(order[snapshot.count])) }
        }
        var big = ChangeSet()
        for i in 0..<200 { big.insertNew("B:\(i)") }
        #expect(big.unhashedCount == 199 && big.hashed(forLookups: 100)?.count == 200)
        #expect(big.hashed(forLookups: 1) == nil)
    }
}

/// `Holders` (an entity's holders in the referrer indexes: the first inline,
/// the rest in an `IDTable`) against a Dictionary under random increments
/// and decrements: the same members and counts, the first slot filled
/// whenever any holder is left (the last of the others moves in when it
/// goes), each holder iterated once, and the same order for the same steps.
struct HoldersTests {
    @Test(arguments: [1, 2, 3] as [UInt64])
    func agreesWithADictionary(seed: UInt64) {
        func run() -> [[String]] {
            var rng = SeededRandom(seed: seed)
            var holders = Holders<Int>()
            var model: [String: Int] = [:]
            var orders: [[String]] = []
            for step in 0..<4000 {
                // Few keys, so the set empties and refills often.
                let n = Int.random(in: 0..<(step % 500 < 250 ? 3 : 40), using: &rng)
                let key = n % 4 == 0 ? "Holder:with-a-longer-identity-\(n)" : "H:\(n)"
                let delta = Int.random(in: -2...2, using: &rng)
                holders.modify(key, default: 0) { v in
                    v += delta
                    return v > 0
                }
                let v = (model[key] ?? 0) + delta
                model[key] = v > 0 ? v : nil
                #expect(holders.count == model.count)
                #expect(holders.isEmpty == model.isEmpty)
                let listed = Array(holders)
                #expect(Set(listed.map(\.key)).count == listed.count, "step \(step): a holder iterated twice")
                #expect(Dictionary(uniqueKeysWithValues: listed.map { ($0.key, $0.value) }) == model, "step \(step)")
                var visited: [String: Int] = [:]
                holders.forEach { k, v in visited[k] = v }
                #expect(visited == model)
                if !model.isEmpty { #expect(holders.value(listed[0].key) == model[listed[0].key]) }
                #expect(holders.value("H:absent") == nil)
                orders.append(listed.map(\.key))
            }
            return orders
        }
        #expect(run() == run(), "the order depends on nothing but the steps")
    }
}
