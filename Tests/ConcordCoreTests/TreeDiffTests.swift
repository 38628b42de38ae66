import ConcordJSON
import Testing

@testable import ConcordCore

/// A key event's `changed`/`deleted` lists: the one-walk path for trees of
/// the same shape must say exactly what the general path (every identity's
/// first occurrence, by hashing) says, on whatever pair it accepts.
struct TreeDiffTests {
    let tree = Tree(idKey: "id")

    /// A random document: objects (some entities), arrays, scalars. Each
    /// identity occurs once, as in a materialized document every occurrence
    /// of one identity is the same version (the fixed case below repeats one).
    func randomValue(_ rng: inout SplitMix, depth: Int) -> JSON {
        let r = rng.next() % 10
        if depth > 3 || r < 3 {
            switch rng.next() % 4 {
            case 0: return .int(rng.next() % 3)
            case 1: return .string(["a", "b", String(repeating: "x", count: 20)][rng.next() % 3])
            case 2: return .bool(rng.next() % 2 == 0)
            default: return .null
            }
        }
        if r < 5 {
            return .array((0..<(rng.next() % 3)).map { _ in randomValue(&rng, depth: depth + 1) })
        }
        var o = JSONObject()
        if rng.next() % 2 == 0 { o["id"] = .string("E:\(rng.next())") }
        for k in ["p", "q", "r"].prefix(rng.next() % 4) { o[k] = randomValue(&rng, depth: depth + 1) }
        return .object(o)
    }

    /// `v` with one random edit: a scalar changed, an element added, members swapped.
    func edited(_ v: JSON, _ rng: inout SplitMix) -> JSON {
        switch v {
        case .object(var o):
            guard !o.members.isEmpty else { return .object(o) }
            let i = rng.next() % o.members.count
            switch rng.next() % 8 {
            case 0 where o.members.count > 1:
                o.members.swapAt(0, o.members.count - 1)
            case 1 where o.members[i].key == "id":
                o.members[i].value = .string("N:\(rng.next())")
            default:
                o.members[i].value = edited(o.members[i].value, &rng)
            }
            return .object(o)
        case .array(var a):
            if a.isEmpty || rng.next() % 8 == 0 {
                a.append(randomValue(&rng, depth: 2))
            } else {
                let i = rng.next() % a.count
                a[i] = edited(a[i], &rng)
            }
            return .array(a)
        default:
            // Mostly a scalar for a scalar; now and then a container.
            return randomValue(&rng, depth: rng.next() % 6 == 0 ? 2 : 4)
        }
    }

    @Test func theSameShapePathAgreesWithTheGeneralOne() {
        var rng = SplitMix(seed: 19)
        var accepted = 0, changedSeen = 0
        for _ in 0..<4000 {
            var o = JSONObject()
            o["id"] = .string("R:1")
            for k in ["p", "q", "r"] { o[k] = randomValue(&rng, depth: 1) }
            let old = JSON.object(o)
            var new = old
            for _ in 0..<(1 + rng.next() % 3) { new = edited(new, &rng) }
            let general = tree.diffByIdentities(old: old, new: new)
            #expect(tree.diff(old: old, new: new) == general)
            if let fast = tree.changedInSameShape(old, new) {
                accepted += 1
                if !fast.isEmpty { changedSeen += 1 }
                #expect(general.deleted.isEmpty)
                #expect(fast == general.changed, "\(old.compactString) → \(new.compactString)")
            }
        }
        // The comparison covered both paths.
        #expect(accepted > 500 && accepted < 3500, "\(accepted)")
        #expect(changedSeen > 300, "\(changedSeen)")
    }

    @Test func nestedChangesArePreOrderAndListedOnce() {
        let old: JSON = ["id": "A:1", "x": ["id": "B:1", "n": 1], "y": [["id": "B:1", "n": 1], ["id": "C:1", "n": 2]]]
        let new: JSON = ["id": "A:1", "x": ["id": "B:1", "n": 5], "y": [["id": "B:1", "n": 5], ["id": "C:1", "n": 2]]]
        #expect(tree.changedInSameShape(old, new) == ["A:1", "B:1"])
        #expect(tree.diff(old: old, new: new).changed == ["A:1", "B:1"])
        // A swapped member order is another shape: the general path decides (nothing changed).
        let swapped: JSON = ["x": ["id": "B:1", "n": 1], "id": "A:1", "y": [["id": "B:1", "n": 1], ["id": "C:1", "n": 2]]]
        #expect(tree.changedInSameShape(old, swapped) == nil)
        #expect(tree.diff(old: old, new: swapped).changed == [])
    }
}
