import ConcordTestSupport
import Testing

@testable import ConcordCore

/// The order-statistic treap against a sorted array, through random inserts
/// and removes by element and by node handle.
@Suite struct OrderTreeTests {
    @Test(arguments: [1, 2, 3] as [UInt64])
    func ranksAndRemovalsByHandleAgreeWithASortedList(seed: UInt64) {
        var rng = SeededRandom(seed: seed)
        var tree = OrderTree<Int>(vacant: 0) { a, b in a.values != b.values ? a.values < b.values : a.id < b.id }
        var reference: [(values: Int, id: UInt32)] = []
        var handles: [UInt32: Int32] = [:]
        func position(_ id: UInt32) -> Int { reference.firstIndex { $0.id == id }! }
        for step in 0..<3000 {
            let id = UInt32.random(in: 0..<400, using: &rng)
            if let node = handles[id] {
                let expected = position(id)
                #expect(tree.rank(node: node) == expected, "seed \(seed) step \(step)")
                let byHandle = Bool.random(using: &rng)
                let removed = byHandle ? tree.remove(node: node) : tree.remove(.init(values: reference[expected].values, id: id))
                #expect(removed == expected, "seed \(seed) step \(step) by handle: \(byHandle)")
                reference.remove(at: expected)
                handles[id] = nil
            } else {
                let values = Int.random(in: 0..<50, using: &rng)
                let (pos, node) = tree.insertNode(.init(values: values, id: id))
                let expected = reference.firstIndex { $0.values > values || ($0.values == values && $0.id > id) } ?? reference.count
                #expect(pos == expected, "seed \(seed) step \(step)")
                reference.insert((values, id), at: expected)
                handles[id] = node
            }
            if step % 100 == 0 {
                #expect(tree.structureViolations().isEmpty, "seed \(seed) step \(step): \(tree.structureViolations().prefix(3))")
                #expect(tree.ids(0 ..< tree.count) == reference.map(\.id))
                for (id, node) in handles { #expect(tree.rank(node: node) == position(id) && tree.element(node).id == id) }
            }
        }
        #expect(tree.count == reference.count)
    }
}
