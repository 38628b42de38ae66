import ConcordJSON
public import ConcordProtocol

/// A copy of everything that decides a mutation's outcome, at one log
/// position: the store (entities, documents, collections, schema), `seq`,
/// the last-change seqs (tombstones included) and the remembered tokens.
/// Taken on the sequencer (values are shared copy-on-write, so the copy is
/// references, not bytes); encoded anywhere (``encode()``).
///
/// Not in it: the change history (feed replay, a read: a host loaded from a
/// snapshot answers `since` older than the snapshot with `truncated`), views
/// and subscriptions (local).
public struct ClusterSnapshot: Sendable {
    public var offset: Int
    /// The log's id of the entry at `offset` (where a host loaded from this snapshot reads on).
    public var streamID: String
    public var hash: String
    public var epoch: String
    public var seq: Int
    var floor: Int
    var clearedAt: Int
    var schema: [(type: String, members: [String])]
    var entities: [(id: String, value: JSON, seq: Int?)]
    var documents: [(key: String, value: JSON, seq: Int?)]
    var collections: [(name: String, items: [JSON], seq: Int?)]
    var tombstones: [(seq: Int, kind: UInt8, name: String)]
    var tokens: [(seq: Int, at: Double, token: String)]

    /// JSON lines: a header, then one line per record, tombstone and token (sorted: equal states encode alike).
    public func encode() -> [UInt8] {
        var w = JSONWriter(capacity: 1 << 16)
        w.raw("{\"concord_snapshot\":1,\"offset\":"); w.int(offset)
        w.raw(",\"stream_id\":"); w.string(streamID)
        w.raw(",\"hash\":"); w.string(hash)
        w.raw(",\"epoch\":"); w.string(epoch)
        w.raw(",\"seq\":"); w.int(seq)
        w.raw(",\"floor\":"); w.int(floor)
        w.raw(",\"cleared_at\":"); w.int(clearedAt)
        w.raw(",\"schema\":"); RecordCodec.writeSchema(&w, schema)
        w.raw("}\n")
        func seqMember(_ s: Int?) {
            if let s { w.raw(",\"s\":"); w.int(s) }
        }
        for e in entities.sorted(by: { $0.id < $1.id }) {
            w.raw("{\"e\":"); w.string(e.id); w.raw(",\"v\":"); w.value(e.value); seqMember(e.seq); w.raw("}\n")
        }
        for d in documents.sorted(by: { $0.key < $1.key }) {
            w.raw("{\"d\":"); w.string(d.key); w.raw(",\"v\":"); w.value(d.value); seqMember(d.seq); w.raw("}\n")
        }
        for c in collections.sorted(by: { $0.name < $1.name }) {
            w.raw("{\"c\":"); w.string(c.name); w.raw(",\"v\":"); w.value(.array(c.items)); seqMember(c.seq); w.raw("}\n")
        }
        for t in tombstones {
            w.raw("{\"t\":"); w.string(t.name); w.raw(",\"k\":"); w.int(Int(t.kind)); w.raw(",\"s\":"); w.int(t.seq); w.raw("}\n")
        }
        for t in tokens {
            // Times in milliseconds (the log's clock): exact in a JSON integer.
            w.raw("{\"k\":"); w.string(t.token); w.raw(",\"s\":"); w.int(t.seq); w.raw(",\"at\":"); w.int(Int((t.at * 1000).rounded()))
            w.raw("}\n")
        }
        return w.bytes
    }

    public struct DecodeError: Error, CustomStringConvertible {
        public let description: String
    }

    public static func decode(_ bytes: [UInt8], maxDepth: Int) throws(DecodeError) -> ClusterSnapshot {
        let parser = JSONParser(maxDepth: maxDepth + 2)
        var lines = bytes.split(separator: 0x0A, omittingEmptySubsequences: true).makeIterator()
        func parse(_ line: ArraySlice<UInt8>) throws(DecodeError) -> JSON {
            do { return try parser.parse(Array(line)) } catch { throw DecodeError(description: "snapshot line does not parse: \(error)") }
        }
        guard let first = lines.next() else { throw DecodeError(description: "empty snapshot") }
        let h = try parse(first)
        guard h["concord_snapshot"] == 1, let offset = h["offset"]?.numberValue?.intValue, let hash = h["hash"]?.stringValue,
              let streamID = h["stream_id"]?.stringValue,
              let epoch = h["epoch"]?.stringValue, let seq = h["seq"]?.numberValue?.intValue,
              let floor = h["floor"]?.numberValue?.intValue, let clearedAt = h["cleared_at"]?.numberValue?.intValue,
              case .object(let schemaObject)? = h["schema"] else {
            throw DecodeError(description: "not a version-1 snapshot header")
        }
        var s = ClusterSnapshot(offset: offset, streamID: streamID, hash: hash, epoch: epoch, seq: seq, floor: floor, clearedAt: clearedAt,
                                schema: schemaObject.members.map { m in (m.key, m.value.arrayValue?.compactMap(\.stringValue) ?? []) },
                                entities: [], documents: [], collections: [], tombstones: [], tokens: [])
        while let line = lines.next() {
            let v = try parse(line)
            let lastSeq = v["s"]?.numberValue?.intValue
            if let id = v["e"]?.stringValue, let value = v["v"] {
                s.entities.append((id, value, lastSeq))
            } else if let key = v["d"]?.stringValue, let value = v["v"] {
                s.documents.append((key, value, lastSeq))
            } else if let name = v["c"]?.stringValue, let items = v["v"]?.arrayValue {
                s.collections.append((name, items, lastSeq))
            } else if let name = v["t"]?.stringValue, let kind = v["k"]?.numberValue?.intValue, let ts = lastSeq {
                s.tombstones.append((ts, UInt8(kind), name))
            } else if let token = v["k"]?.stringValue, let ts = lastSeq, let at = v["at"]?.numberValue?.intValue {
                s.tokens.append((ts, Double(at) / 1000, token))
            } else {
                throw DecodeError(description: "unknown snapshot line")
            }
        }
        return s
    }
}

extension Engine {
    /// The replicated state as of the last applied log entry (cluster mode).
    public func clusterSnapshot() -> ClusterSnapshot {
        let cl = cluster
        var entities: [(id: String, value: JSON, seq: Int?)] = []
        entities.reserveCapacity(store.entities.count)
        for id in store.entities.keys { entities.append((id, store.entity(id)!, versions.entities[id])) }
        var documents: [(key: String, value: JSON, seq: Int?)] = []
        for key in store.documents.keys { documents.append((key, store.document(key)!, versions.documents[key])) }
        var collections: [(name: String, items: [JSON], seq: Int?)] = []
        for name in store.collections.keys { collections.append((name, store.collectionItems(name), versions.collections[name])) }
        let live = versions.liveTombstones
        return ClusterSnapshot(offset: cl?.appliedOffset ?? 0, streamID: cl?.lastStreamID ?? "", hash: cl?.lastHash ?? "", epoch: cl?.epoch ?? "", seq: seq,
                               floor: versions.floor, clearedAt: versions.clearedAt, schema: store.requiredLists,
                               entities: entities, documents: documents, collections: collections,
                               tombstones: live, tokens: versions.liveTokens)
    }

    /// Loads a snapshot into an engine that holds nothing yet (a host
    /// joining, or starting after its position was trimmed from the log).
    /// Afterwards the host applies the log from the entry after the snapshot's offset.
    public func loadClusterSnapshot(_ s: ClusterSnapshot) throws(ProtocolError) {
        guard store.entities.isEmpty, store.documents.isEmpty, store.collections.isEmpty, seq == 0 else {
            throw ProtocolError(.internal, "a snapshot loads only into an empty host")
        }
        store.trackRecordChanges = false
        store.setSchema(s.schema)
        do throws(ProtocolError) {
            for e in s.entities {
                _ = store.apply(try store.prepareUpdate(model: e.value, key: nil, mode: .replace, force: false))
            }
            for d in s.documents {
                _ = store.apply(try store.prepareUpdate(model: d.value, key: d.key, mode: .replace, force: false))
            }
            for c in s.collections { _ = try store.collectionSet(c.name, items: c.items) }
        } catch {
            store.rollback()
            throw error
        }
        store.commit()
        store.trackRecordChanges = true
        seq = s.seq
        versions.load(entities: s.entities.compactMap { e in e.seq.map { (e.id, $0) } },
                      documents: s.documents.compactMap { d in d.seq.map { (d.key, $0) } },
                      collections: s.collections.compactMap { c in c.seq.map { (c.name, $0) } },
                      floor: s.floor, clearedAt: s.clearedAt, tombstones: s.tombstones, tokens: s.tokens, seq: s.seq)
        if let cl = cluster {
            cl.appliedOffset = s.offset
            cl.lastHash = s.hash
            cl.lastStreamID = s.streamID
            cl.epoch = s.epoch
            cl.headOffset = max(cl.headOffset, s.offset)
            if cl.link == .catchingUp, cl.headOffset - cl.appliedOffset <= ClusterState.catchUpLag { cl.link = .attached }
        }
        checkInvariantsIfEnabled()
    }
}

extension Versions {
    /// Tombstones still in the window, oldest first.
    var liveTombstones: [(seq: Int, kind: UInt8, name: String)] { Array(tombstoneList) }
    /// Remembered tokens in acceptance order (what expiry walks).
    var liveTokens: [(seq: Int, at: Double, token: String)] { tokenList.filter { tokens[$0.token] == $0.seq } }

    func load(entities e: [(String, Int)], documents d: [(String, Int)], collections c: [(String, Int)], floor f: Int, clearedAt: Int,
              tombstones t: [(seq: Int, kind: UInt8, name: String)], tokens k: [(seq: Int, at: Double, token: String)], seq: Int) {
        entities = IDTable()
        documents = IDTable()
        collections = IDTable()
        for (k, v) in e { entities[k] = v }  // a repeated name: the last wins
        for (k, v) in d { documents[k] = v }
        for (k, v) in c { collections[k] = v }
        // A tombstone may be older than the name's last change (re-created since): the later seq wins.
        for x in t {
            switch x.kind {
            case 0: entities[x.name] = max(entities[x.name] ?? 0, x.seq)
            case 1: documents[x.name] = max(documents[x.name] ?? 0, x.seq)
            default: collections[x.name] = max(collections[x.name] ?? 0, x.seq)
            }
        }
        floor = f
        self.clearedAt = clearedAt
        replaceTombstones(t)
        for x in k { remember(token: x.token, seq: x.seq, now: x.at) }
        markHistoryLost(at: seq)
    }
}
