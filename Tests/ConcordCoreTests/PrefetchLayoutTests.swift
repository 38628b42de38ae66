@testable import ConcordCore
import ConcordJSON
import Testing

/// Propagation prefetches records and their member lists by reading
/// addresses as machine words, not through references (a retain writes to
/// the object and waits for its line). A prefetch at a wrong address only
/// loses its benefit, so nothing else would notice a layout that moved:
/// these tests do.
struct PrefetchLayoutTests {
    static func address(_ object: AnyObject) -> UInt { UInt(bitPattern: Unmanaged.passUnretained(object).toOpaque()) }

    @Test func aRecordsValueIsWhereThePrefetchLooks() {
        let members = [JSONObject.Member(key: "id", value: .string("Post:1")), JSONObject.Member(key: "date", value: .number(JSONNumber(7)))]
        let rec = EntityRecord(value: .object(JSONObject(members)), children: Children())
        guard case .object(let o) = rec.value else { Issue.record("not an object"); return }
        let list = unsafeBitCast(o.members, to: UInt.self)
        #expect(EntityRecord.valueStorageWord(ofRecordAt: Self.address(rec)) == list)
        withExtendedLifetime((rec, o)) {}
    }

    @Test func aHoldingsFirstWordIsItsRecord() {
        let recs = (0..<3).map { EntityRecord(value: .number(JSONNumber($0)), children: Children()) }
        var table = IDTable<Store.Holding>()
        for (i, r) in recs.enumerated() { table["E:\(i)"] = Store.Holding(record: r, count: i + 1) }
        var words: [UInt] = []
        table.forEachFirstWord { words.append($0) }
        #expect(words == recs.map(Self.address))
        withExtendedLifetime(recs) {}
    }

    @Test func aRefreshEntrysRecordIsWhereThePrefetchLooks() {
        let rec = EntityRecord(value: .null, children: Children())
        let list: [(id: String, record: EntityRecord)] = [("Post:1", rec), ("a longer identity than fifteen bytes", rec)]
        for i in list.indices {
            let word = list.withUnsafeBufferPointer {
                UnsafeRawPointer($0.baseAddress! + i).load(fromByteOffset: Store.refreshEntryRecordOffset, as: UInt.self)
            }
            #expect(word == Self.address(rec))
        }
    }
}
