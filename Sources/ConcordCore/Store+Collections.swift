import ConcordJSON
import ConcordProtocol

/// An ordered list of entity references, with each item's current value
/// kept beside its identity (so reading the list never walks the store).
final class CollectionRecord {
    var ids: [String]
    var values: [JSON]

    init(ids: [String] = [], values: [JSON] = []) {
        self.ids = ids
        self.values = values
    }

    var count: Int { ids.count }
}

/// The inverse of one collection edit.
enum CollectionUndo {
    /// The collection did not exist before: drop it.
    case drop(String)
    /// The collection was removed: put this record back.
    case restore(String, CollectionRecord)
    case removeRange(String, index: Int, count: Int)
    case insert(String, index: Int, ids: [String], values: [JSON])
    case setValue(String, index: Int, value: JSON)
}

/// One step of a collection's change list (PROTOCOL.md §4 collections).
/// Applied in order to the previous list, the steps give the new list.
enum CollectionStep {
    case insert(index: Int, items: [JSON])
    case remove(index: Int, count: Int)
    case update(index: Int, item: JSON)
    case reset(items: [JSON])
}

extension Store {
    // MARK: Reading

    func collectionItems(_ name: String) -> [JSON] { collections[name]?.values ?? [] }

    // MARK: Mutations

    /// Checks that every item is an entity, then writes them as a replace-mode update.
    private func writeItems(_ items: [JSON]) throws(ProtocolError) -> (StoreChange, PreparedUpdate, [String]) {
        var ids: [String] = []
        ids.reserveCapacity(items.count)
        for (i, item) in items.enumerated() {
            guard let id = item.identity(idKey: tree.idKey) else {
                throw ProtocolError(.notEntity, "items[\(i)] is not an entity: it needs a non-empty string or integer '\(tree.idKey)'")
            }
            ids.append(id)
        }
        let prepared = try prepareUpdate(model: .array(items), key: nil, mode: .replace, force: false)
        let change = apply(prepared)
        return (change, prepared, ids)
    }

    /// `collection.set`: the items are written as updates, then the list is
    /// replaced. Expressed as changes, not a reset: the common prefix and
    /// suffix (by identity) are kept and the middle is one `remove` plus one
    /// `insert`, so appending to or trimming a list costs what changed.
    func collectionSet(_ name: String, items: [JSON]) throws(ProtocolError) -> (StoreChange, PreparedUpdate) {
        let (change, prepared, ids) = try writeItems(items)
        let record = touchCollection(name, create: true)!
        let old = record.ids
        var prefix = 0
        while prefix < old.count && prefix < ids.count && old[prefix] == ids[prefix] { prefix += 1 }
        var suffix = 0
        while suffix < old.count - prefix && suffix < ids.count - prefix && old[old.count - 1 - suffix] == ids[ids.count - 1 - suffix] {
            suffix += 1
        }
        let removeCount = old.count - prefix - suffix
        let insertIDs = Array(ids[prefix..<(ids.count - suffix)])
        if removeCount > 0 { removeItems(record, name, at: prefix, count: removeCount) }
        if !insertIDs.isEmpty { insertItems(record, name, insertIDs, at: prefix) }
        return (change, prepared)
    }

    func collectionInsert(_ name: String, index: Int?, items: [JSON]) throws(ProtocolError) -> (StoreChange, PreparedUpdate) {
        let count = collections[name]?.count ?? 0
        if let index, index < 0 || index > count {
            throw ProtocolError(.badIndex, "index \(index) is outside 0...\(count) for collection '\(clipID(name))'")
        }
        let (change, prepared, ids) = try writeItems(items)
        let record = touchCollection(name, create: true)!
        if !ids.isEmpty { insertItems(record, name, ids, at: index ?? record.count) }
        return (change, prepared)
    }

    func collectionRemove(_ name: String, index: Int, count n: Int) throws(ProtocolError) {
        let count = collections[name]?.count ?? 0
        guard n >= 1 else { throw ProtocolError(.badRequest, "member 'count' must be at least 1") }
        guard index >= 0, index + n <= count else {
            throw ProtocolError(.badIndex, "cannot remove \(n) item(s) at index \(index) from collection '\(clipID(name))' of \(count)")
        }
        let record = touchCollection(name, create: false)!
        removeItems(record, name, at: index, count: n)
    }

    func collectionRemoveIDs(_ name: String, ids: [String]) {
        guard collections[name] != nil else { return }
        let doomed = Set(ids)
        guard let record = touchCollection(name, create: false) else { return }
        removeRuns(record, name) { doomed.contains($0) }
    }

    func collectionDelete(_ name: String) -> StoreChange {
        var change = StoreChange()
        change.collectionsDeleted.insert(name)
        touchedCollections.insert(name)
        if let old = collections[name] {
            setCollection(name, nil)
            collectionUndo.append(.restore(name, old))
        }
        return change
    }

    // MARK: Propagation from entities

    /// Every index holding `id` gets its current value and an `update` change.
    /// `changed`: false for a forced rewrite of an unchanged entity (its
    /// `update` changes are sent, but the list did not change).
    func refreshInCollections<S: Sequence<String>>(_ ids: S, changed: Bool = true) {
        if collectionReferrers.isEmpty { return }
        // Gathered first, then recorded per collection in index order: the
        // ids come from a Set, whose iteration order differs between
        // processes, and an event's `changes` must be the same bytes on every
        // run and every replica.
        var positions: [String: [Int]] = [:]
        for id in ids {
            guard let holders = collectionReferrers[id] else { continue }
            for name in holders.keys {
                guard let record = collections[name] else { continue }
                for i in record.ids.indices where record.ids[i] == id { positions[name, default: []].append(i) }
            }
        }
        for (name, var indices) in positions {
            guard let record = touchCollection(name, create: false) else { continue }
            indices.sort()
            for i in indices {
                guard let value = entities[record.ids[i]]?.value else { continue }
                collectionUndo.append(.setValue(name, index: i, value: record.values[i]))
                record.values[i] = value
                recordChange(name, .update(index: i, item: value), changed: changed)
            }
        }
    }

    /// Every occurrence of a deleted entity leaves every collection.
    func removeFromCollections(_ deleted: Set<String>) {
        var names: Set<String> = []
        for d in deleted { if let h = collectionReferrers[d] { names.formUnion(h.keys) } }
        for name in names {
            guard let record = touchCollection(name, create: false) else { continue }
            removeRuns(record, name) { deleted.contains($0) }
        }
    }

    // MARK: Internals

    /// The record, created when asked (and its creation logged for undo).
    private func touchCollection(_ name: String, create: Bool) -> CollectionRecord? {
        if let r = collections[name] { return r }
        guard create else { return nil }
        let r = CollectionRecord()
        collections[name] = r
        touchedCollections.insert(name)
        collectionUndo.append(.drop(name))
        return r
    }

    /// Reverts the running mutation's collection edits, newest first.
    func undoCollections() {
        for u in collectionUndo.reversed() {
            switch u {
            case .drop(let name):
                setCollection(name, nil)
            case .restore(let name, let record):
                setCollection(name, record)
            case .removeRange(let name, let index, let count):
                guard let r = collections[name] else { continue }
                for id in r.ids[index..<(index + count)] { adjustCollectionReferrer(of: id, name, by: -1) }
                r.ids.removeSubrange(index..<(index + count))
                r.values.removeSubrange(index..<(index + count))
            case .insert(let name, let index, let ids, let values):
                guard let r = collections[name] else { continue }
                r.ids.insert(contentsOf: ids, at: index)
                r.values.insert(contentsOf: values, at: index)
                for id in ids { adjustCollectionReferrer(of: id, name, by: 1) }
            case .setValue(let name, let index, let value):
                collections[name]?.values[index] = value
            }
        }
        collectionUndo.removeAll()
    }

    private func insertItems(_ record: CollectionRecord, _ name: String, _ ids: [String], at index: Int) {
        let values = ids.map { entities[$0]?.value ?? .null }
        record.ids.insert(contentsOf: ids, at: index)
        record.values.insert(contentsOf: values, at: index)
        for id in ids { adjustCollectionReferrer(of: id, name, by: 1) }
        collectionUndo.append(.removeRange(name, index: index, count: ids.count))
        recordChange(name, .insert(index: index, items: values))
    }

    private func removeItems(_ record: CollectionRecord, _ name: String, at index: Int, count: Int) {
        for id in record.ids[index..<(index + count)] { adjustCollectionReferrer(of: id, name, by: -1) }
        collectionUndo.append(.insert(name, index: index, ids: Array(record.ids[index..<(index + count)]), values: Array(record.values[index..<(index + count)])))
        record.ids.removeSubrange(index..<(index + count))
        record.values.removeSubrange(index..<(index + count))
        recordChange(name, .remove(index: index, count: count))
    }

    /// Removes every item matching `doomed`, last run first, so each change's
    /// index is valid against the list the previous change left.
    private func removeRuns(_ record: CollectionRecord, _ name: String, _ doomed: (String) -> Bool) {
        var end = record.count
        while end > 0 {
            guard doomed(record.ids[end - 1]) else {
                end -= 1
                continue
            }
            var start = end - 1
            while start > 0 && doomed(record.ids[start - 1]) { start -= 1 }
            removeItems(record, name, at: start, count: end - start)
            end = start
        }
    }

    private func recordChange(_ name: String, _ c: CollectionStep, changed: Bool = true) {
        if changed { collectionsChanged.insert(name) }
        touchedCollections.insert(name)
        if case .update(let i, _) = c, case .update(let j, _)? = collectionChanges[name]?.last, i == j {
            collectionChanges[name]![collectionChanges[name]!.count - 1] = c
            return
        }
        collectionChanges[name, default: []].append(c)
    }

    /// Puts a loaded collection in memory (read-through; not a mutation).
    func installCollection(_ name: String, _ ids: [String]) {
        setCollection(name, CollectionRecord(ids: ids, values: ids.map { entities[$0]?.value ?? .null }))
    }

    /// Replaces a collection wholesale (rollback, delete), keeping referrers right.
    func setCollection(_ name: String, _ record: CollectionRecord?) {
        if let old = collections[name] {
            for id in old.ids { adjustCollectionReferrer(of: id, name, by: -1) }
        }
        collections[name] = record
        if let record {
            for id in record.ids { adjustCollectionReferrer(of: id, name, by: 1) }
        }
    }

    private func adjustCollectionReferrer(of id: String, _ name: String, by n: Int) {
        var holders = collectionReferrers.removeValue(forKey: id) ?? [:]
        let v = (holders[name] ?? 0) + n
        holders[name] = v > 0 ? v : nil
        if !holders.isEmpty { collectionReferrers[id] = holders }
    }
}
