import Testing

@testable import ConcordCore

/// The history behind `feed` with `since` (PROTOCOL.md §3.2) against a
/// model that keeps every mutation's identities in a list of its own:
/// trimming by mutations and by identities, and the compaction of the flat
/// list (past 1,024 identities dropped), must not change what a replay finds.
struct VersionsTests {
    @Test(arguments: [(30, 1_000_000), (30, 12), (400, 1_000_000), (1_000_000, 700)])
    func historyReplaysExactlyTheRecentChanges(mutations: Int, entityLimit: Int) {
        let versions = Versions(historyMutations: mutations, historyEntityLimit: entityLimit, tokenRetention: 0, tokenByteLimit: 1 << 20)
        let store = Store(idKey: "id")
        var rng = SplitMix(seed: UInt64(mutations &* 31 &+ entityLimit))
        var model: [(seq: Int, ids: [String])] = []
        var head = 0, held = 0, floor = 0
        for seq in 1...6000 {
            var ids: [String] = []
            var change = StoreChange()
            for _ in 0..<(rng.next() % 4) {
                let id = "E:\(rng.next() % 60)"
                if !ids.contains(id) {
                    ids.append(id)
                    change.valueChanged.insert(id)
                }
            }
            versions.record(seq: seq, written: ids, change: change, keys: [], collections: [],
                            collectionChanged: { _ in false }, store: store)
            if !ids.isEmpty {
                model.append((seq, ids))
                held += ids.count
            }
            while head < model.count, model[head].seq <= seq - mutations || held > entityLimit {
                floor = model[head].seq
                held -= model[head].ids.count
                head += 1
            }
            guard seq % 7 == 0 else { continue }
            for since in [floor - 1, floor, seq - 1 - rng.next() % 50, seq] {
                let found = versions.changed(after: since)
                guard since >= floor else {
                    #expect(found == nil, "seq \(seq) since \(since): the history does not reach back")
                    continue
                }
                var last: [String: Int] = [:]
                for m in model[head...] where m.seq > since { for id in m.ids { last[id] = m.seq } }
                let want = last.map { (id: $0.key, seq: $0.value) }
                    .sorted { $0.seq != $1.seq ? $0.seq < $1.seq : QueryEval.compareStrings($0.id, $1.id) < 0 }
                #expect(found?.map(\.id) == want.map(\.id) && found?.map(\.seq) == want.map(\.seq),
                        "seq \(seq) since \(since)")
            }
        }
        #expect(versions.historyEntities == held)
    }
}
