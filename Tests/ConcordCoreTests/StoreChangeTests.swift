import Testing

@testable import ConcordCore

/// `StoreChange` keeps its rarely filled sets in a box shared by copies
/// until one is written: a copy behaves as a value.
struct StoreChangeTests {
    @Test func copiesAreValuesWhateverSetIsWritten() {
        var a = StoreChange()
        #expect(a.deleted.isEmpty && a.documentsForced.isEmpty)
        a.deleted.insert("A:1")
        var b = a
        b.deleted.insert("A:2")
        b.collectionsDeleted.insert("list")
        #expect(Array(a.deleted) == ["A:1"])
        #expect(Array(b.deleted) == ["A:1", "A:2"])
        #expect(a.collectionsDeleted.isEmpty)
        #expect(Array(b.collectionsDeleted) == ["list"])

        // Written through the setter as well as in place.
        var c = b
        c.documentsDeleted = IDSet(["k"])
        #expect(b.documentsDeleted.isEmpty)
        #expect(Array(c.documentsDeleted) == ["k"])
    }

    @Test func unionTakesEverySet() {
        var a = StoreChange()
        a.valueChanged.insert("A:1")
        var b = StoreChange()
        b.recordChanged.insert("B:1")
        b.documentsChanged.insert("k")
        b.deleted.insert("C:1")
        b.forcedHolders.insert("D:1")
        b.documentsDeleted.insert("k2")
        b.documentsForced.insert("k3")
        b.collectionsDeleted.insert("l")
        a.formUnion(b)
        #expect(Array(a.valueChanged) == ["A:1"])
        #expect(Array(a.recordChanged) == ["B:1"])
        #expect(Array(a.documentsChanged) == ["k"])
        #expect(Array(a.deleted) == ["C:1"])
        #expect(Array(a.forcedHolders) == ["D:1"])
        #expect(Array(a.documentsDeleted) == ["k2"])
        #expect(Array(a.documentsForced) == ["k3"])
        #expect(Array(a.collectionsDeleted) == ["l"])
        // `b` is unchanged by the union's writes to `a`.
        a.deleted.insert("C:2")
        #expect(Array(b.deleted) == ["C:1"])
    }
}
