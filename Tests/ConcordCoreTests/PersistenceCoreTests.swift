import ConcordJSON
import Testing

@testable import ConcordCore

/// A backend as bytes in a dictionary, driven by hand: the test decides when
/// the "storage thread" runs, so races between loads and writes are exact.
final class FakeStorage {
    var records: [String: [UInt8]] = [:]
    var queue: [StorageItem] = []
    let codec = RecordCodec(idKey: "id")

    func take(from engine: Engine) { queue += engine.takeStorageItems() }

    /// Runs everything queued, in order, and feeds the results back.
    func run(_ engine: Engine) {
        let items = queue
        queue = []
        var committed = 0
        for item in items {
            switch item {
            case .write(let seq, let writes):
                for w in writes {
                    switch w.value {
                    case nil: records[w.key] = nil
                    case .entity(let v)?: records[w.key] = codec.encode(record: codec.normalize(v, includingRoot: false), changedAt: w.changedAt)
                    case .document(let v)?: records[w.key] = codec.encode(record: codec.normalize(v, includingRoot: true), changedAt: w.changedAt)
                    case .collection(let ids)?: records[w.key] = codec.encode(collection: ids, changedAt: w.changedAt)
                    case .schema(let s)?: records[w.key] = codec.encode(schema: s)
                    case .token(let n)?: records[w.key] = codec.encode(token: n)
                    }
                }
                committed = max(committed, seq)
            case .clear(let seq, _):
                records = [:]
                committed = max(committed, seq)
            case .reserve:
                break
            case .load(let req):
                var result = LoadResult(ticket: req.ticket)
                var queue = req.keys
                var seen = Set(queue)
                while !queue.isEmpty {
                    let key = queue.removeFirst()
                    guard let bytes = records[key], let (kind, _) = RecordCodec.parse(key: key) else {
                        result.absent.append(key)
                        continue
                    }
                    var refs: [String] = []
                    switch kind {
                    case .entity:
                        let (r, s) = codec.decodeRecordAndChange(bytes)!
                        result.records[key] = .entity(r)
                        if s > 0 { result.changedAt[key] = s }
                        refs = codec.references(r, includingRoot: false)
                    case .document:
                        let (r, s) = codec.decodeRecordAndChange(bytes)!
                        result.records[key] = .document(r)
                        if s > 0 { result.changedAt[key] = s }
                        refs = codec.references(r, includingRoot: true)
                    case .token:
                        result.records[key] = .token(codec.decodeToken(bytes)!)
                    case .collection:
                        let ids = codec.decodeCollection(bytes)!
                        result.records[key] = .collection(ids)
                        refs = ids
                    case .schema:
                        break
                    }
                    for id in refs where seen.insert(RecordCodec.entityKey(id)).inserted { queue.append(RecordCodec.entityKey(id)) }
                }
                engine.install(result)
            }
        }
        if committed > 0 { engine.storageCommitted(through: committed) }
    }
}

struct PersistenceCoreTests {
    func harness(_ durability: Durability = .async) -> EngineHarness {
        let h = EngineHarness()
        h.engine.enablePersistence(durability: durability, schema: nil)
        return h
    }

    /// Sends without expecting an immediate response (the request may be parked).
    func sendParked(_ c: TestConn, _ line: String) {
        c.harness.engine.handleLine(Array(line.utf8), from: c.id)
        c.harness.pumpForTests()
    }

    /// A subscribed key's document is in memory or absent (it is never
    /// evicted): the key table says so, so the read-through neither reads
    /// it again nor keeps a negative entry for it beside the subscription.
    @Test func aSubscribedAbsentKeyIsNotReadAgainNorListedAsAbsent() {
        let h = harness()
        let s = FakeStorage()
        let a = h.connect(), b = h.connect(), w = h.connect()
        func loads() -> Int {
            s.take(from: h.engine)
            return s.queue.filter { if case .load = $0 { true } else { false } }.count
        }
        sendParked(a, #"{"op":"subscribe","sub":"a","key":"gone","rid":1}"#)
        #expect(loads() == 1)
        s.run(h.engine)
        h.pumpForTests()
        #expect(a.takeResponses().first?["model"] == .null)
        #expect(h.engine.persistence?.knownAbsent.contains("d:gone") == false)

        // A second subscription and a get are answered from memory.
        sendParked(b, #"{"op":"subscribe","sub":"b","key":"gone","rid":2}"#)
        sendParked(b, #"{"op":"get","key":"gone","rid":3}"#)
        #expect(loads() == 0)
        #expect(b.takeResponses().map { $0["rid"] } == [2, 3])

        // Written and deleted while watched: both hear it; the delete makes it known absent.
        w.ok(#"{"op":"update","key":"gone","model":{"n":1}}"#)
        #expect(a.take().map { $0["model"]?["n"] } == [1])
        #expect(b.take().map { $0["model"]?["n"] } == [1])
        w.ok(#"{"op":"delete","key":"gone"}"#)
        #expect(a.take().map { $0["event"] } == ["delete"])
        s.run(h.engine)
        sendParked(a, #"{"op":"get","key":"gone","rid":4}"#)
        #expect(loads() == 0)
        #expect(a.takeResponses().first?["model"] == .null)

        // Unwatched again and never listed: the next read goes to the backend.
        sendParked(a, #"{"op":"subscribe","sub":"a2","key":"other","rid":5}"#)
        #expect(loads() == 1)
        s.run(h.engine)
        h.pumpForTests()
        a.ok(#"{"op":"unsubscribe","sub":"a2"}"#)
        sendParked(a, #"{"op":"get","key":"other","rid":6}"#)
        #expect(loads() == 1)
        s.run(h.engine)
        h.pumpForTests()
        #expect(a.takeResponses().map { $0["rid"] } == [5, 6])
    }

    @Test func writesReachTheBackendNormalized() {
        let h = harness()
        let s = FakeStorage()
        let a = h.connect()
        a.ok(#"{"op":"update","key":"k","model":{"list":[{"id":"M:1","from":{"id":"U:1","n":"a"}}]}}"#)
        s.take(from: h.engine)
        s.run(h.engine)
        #expect(String(decoding: s.records["e:M:1"]!, as: UTF8.self) == #"{"v":1,"s":1,"r":{"id":"M:1","from":{"id":"U:1"}}}"#)
        #expect(String(decoding: s.records["d:k"]!, as: UTF8.self) == #"{"v":1,"s":1,"r":{"list":[{"id":"M:1"}]}}"#)
        #expect(String(decoding: s.records["e:U:1"]!, as: UTF8.self) == #"{"v":1,"s":1,"r":{"id":"U:1","n":"a"}}"#)
    }

    @Test func aRestartedEngineReadsThroughWithCurrentEntities() {
        let s = FakeStorage()
        do {
            let h = harness()
            let a = h.connect()
            a.ok(#"{"op":"update","key":"k","model":{"list":[{"id":"M:1","from":{"id":"U:1","n":"a"}}]}}"#)
            a.ok(#"{"op":"update","model":{"id":"U:1","n":"b"}}"#)
            s.take(from: h.engine)
            s.run(h.engine)
        }
        let h = harness()
        let a = h.connect()
        sendParked(a, #"{"op":"get","key":"k","rid":1}"#)
        sendParked(a, #"{"op":"ping","rid":2}"#)
        #expect(a.responses.isEmpty)  // parked behind the load, in order
        s.take(from: h.engine)
        s.run(h.engine)
        h.pumpForTests()
        #expect(a.responses.count == 2)
        #expect(a.responses[0]["rid"] == 1)
        #expect(a.responses[0]["model"] == json(#"{"list":[{"id":"M:1","from":{"id":"U:1","n":"b"}}]}"#))
        #expect(a.responses[1]["rid"] == 2)
    }

    @Test func aLoadNeverResurrectsWhatWasDeletedMeanwhile() {
        let s = FakeStorage()
        do {
            let h = harness()
            h.connect().ok(#"{"op":"update","model":{"id":"X","v":1}}"#)
            s.take(from: h.engine)
            s.run(h.engine)
        }
        let h = harness()
        let a = h.connect()
        let b = h.connect()
        sendParked(a, #"{"op":"get","id":"X","rid":"late"}"#)
        s.take(from: h.engine)  // the load is queued first...
        b.ok(#"{"op":"delete","id":"X"}"#)  // ...then X is deleted
        s.take(from: h.engine)
        s.run(h.engine)  // the load reads X before the delete lands
        h.pumpForTests()
        #expect(a.responses.last?["model"] == .null)
        #expect(s.records["e:X"] == nil)
    }

    @Test func referencesToGoneEntitiesArePrunedOnLoadAndRepaired() {
        let s = FakeStorage()
        do {
            let h = harness()
            let a = h.connect()
            a.ok(#"{"op":"schema","required":{"Msg":["from"]}}"#)
            a.ok(#"{"op":"update","key":"k","model":{"items":[{"id":"Msg:1","from":{"id":"U:1"}},{"id":"Msg:2","from":{"id":"U:2"}}],"pin":{"id":"U:1"}}}"#)
            s.take(from: h.engine)
            s.run(h.engine)
        }
        s.records["e:U:1"] = nil  // evicted by the backend
        let h = harness()
        h.engine.enablePersistence(durability: .async, schema: [("Msg", ["from"])])
        let a = h.connect()
        sendParked(a, #"{"op":"get","key":"k"}"#)
        s.take(from: h.engine)
        s.run(h.engine)
        h.pumpForTests()
        #expect(a.responses.last?["model"] == json(#"{"items":[{"id":"Msg:2","from":{"id":"U:2"}}],"pin":null}"#))
        s.take(from: h.engine)
        s.run(h.engine)
        #expect(s.records["e:Msg:1"] == nil)
        #expect(String(decoding: s.records["d:k"]!, as: UTF8.self) == #"{"v":1,"r":{"items":[{"id":"Msg:2"}],"pin":null}}"#)
    }

    @Test func syncDurabilityHoldsTheAcknowledgementAndWhatFollows() {
        let h = harness(.sync)
        let s = FakeStorage()
        let a = h.connect()
        sendParked(a, #"{"op":"update","model":{"id":"A","v":1},"rid":1}"#)
        sendParked(a, #"{"op":"ping","rid":2}"#)
        #expect(a.responses.isEmpty)
        s.take(from: h.engine)
        s.run(h.engine)
        h.pumpForTests()
        #expect(a.responses.map { $0["rid"] } == [1, 2])
        #expect(a.responses[0]["seq"] == 1)
    }

    /// Sync durability and a failing backend (docs/PROTOCOL.md, "Durability"):
    /// an applied mutation is never reported as not applied; once the wait
    /// gives up it is answered ok with `"durable":false` and its seq; while the
    /// backend fails, new mutations are refused before they change anything.
    @Test func aFailingBackendInSyncModeNeverReportsAnAppliedWriteAsFailed() {
        let h = harness(.sync)
        let a = h.connect()
        sendParked(a, #"{"op":"update","model":{"id":"A","v":1},"rid":1}"#)
        _ = h.engine.takeStorageItems()
        h.engine.storageFailing(message: "disk full", backlog: 1)
        h.pumpForTests()
        #expect(a.responses.isEmpty, "the acknowledgement waits while storing is retried")
        h.engine.releaseNotDurable(reason: "disk full")
        h.pumpForTests()
        #expect(a.responses.last?["ok"] == true)
        #expect(a.responses.last?["seq"] == 1)
        #expect(a.responses.last?["durable"] == false)
        #expect(a.responses.last?["warning"]?["code"] == "cache_error")
        // While failing: refused, nothing applied, no seq taken.
        #expect(a.error(#"{"op":"update","model":{"id":"A","v":2}}"#) == "cache_error")
        #expect(h.engine.seq == 1)
        #expect(h.engine.store.entity("A")?["v"] == 1)
        // Stored again: writes are accepted.
        h.engine.storageCommitted(through: 1)
        sendParked(a, #"{"op":"update","model":{"id":"A","v":3},"rid":3}"#)
        h.engine.storageCommitted(through: 2)
        h.pumpForTests()
        #expect(a.responses.last?["seq"] == 2)
        #expect(a.responses.last?["durable"] == nil)
    }

    @Test func asyncWritesAreRefusedOnlyWhenTheUnstoredBacklogIsOverItsLimit() {
        let h = harness()
        h.engine.enablePersistence(durability: .async, schema: nil, maxUnstored: 10)
        let a = h.connect()
        h.engine.storageFailing(message: "disk full", backlog: 0)
        for i in 0..<11 { a.ok(#"{"op":"update","model":{"id":"E:\#(i)"}}"#) }
        #expect(a.error(#"{"op":"update","model":{"id":"E:x"}}"#) == "cache_error")
        h.engine.storageCommitted(through: 11)
        a.ok(#"{"op":"update","model":{"id":"E:x"}}"#)
    }

    @Test func noSequenceNumberIsIssuedBeyondTheReservation() {
        let h = harness()
        h.engine.enablePersistence(durability: .async, schema: nil, lastSeq: 100, reserved: 102)
        let a = h.connect()
        #expect(a.ok(#"{"op":"update","model":{"id":"A","v":1}}"#)["seq"] == 101)
        #expect(a.ok(#"{"op":"update","model":{"id":"A","v":2}}"#)["seq"] == 102)
        #expect(a.error(#"{"op":"update","model":{"id":"A","v":3}}"#) == "cache_error")
        // The engine asked for more ahead of time; once stored, numbering goes on.
        #expect(h.engine.takeStorageItems().contains { if case .reserve = $0 { return true } else { return false } })
        h.engine.storageCommitted(through: 102, reserved: 102 + Engine.reservationBlock)
        #expect(a.ok(#"{"op":"update","model":{"id":"A","v":3}}"#)["seq"] == 103)
    }

    @Test func evictionKeepsWatchedAndReferencedRecords() {
        let h = harness()
        let s = FakeStorage()
        let a = h.connect()
        a.ok(#"{"op":"update","model":{"id":"W","v":1}}"#)
        a.ok(#"{"op":"subscribe","sub":"w","ids":["W"]}"#)
        a.ok(#"{"op":"update","model":{"id":"P","child":{"id":"C"}}}"#)
        for i in 0..<100 { a.ok(#"{"op":"update","model":{"id":"E:\#(i)"}}"#) }
        // Nothing goes before the backend has it.
        h.engine.memoryLimit = 1
        #expect(h.engine.evictIfOverLimit(bytesInUse: { 2 }) == 0)
        s.take(from: h.engine)
        s.run(h.engine)
        let evicted = h.engine.evictIfOverLimit(bytesInUse: { 2 })
        #expect(evicted == 102)  // E:0..99 and P; then C, once P no longer holds it
        #expect(h.engine.store.entities["W"] != nil)  // watched
        #expect(h.engine.store.entities["C"] == nil)
        sendParked(a, #"{"op":"get","id":"P","rid":"p"}"#)
        s.take(from: h.engine)
        s.run(h.engine)
        h.pumpForTests()
        #expect(a.responses.last?["model"] == json(#"{"id":"P","child":{"id":"C"}}"#))
    }
}

extension EngineHarness {
    func pumpForTests() { pumpPublic() }
}
