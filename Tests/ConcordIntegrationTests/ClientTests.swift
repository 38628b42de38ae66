import ConcordClient
import ConcordJSON
import ConcordTestSupport
import ConcordTestServer
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

struct Person: ConcordModel, Equatable {
    var id: ConcordID<Person>
    var name: String
}

struct Message: ConcordModel, Equatable {
    var id: ConcordID<Message>
    var text: String
    var sender: Person
}

struct Post: ConcordModel, Equatable {
    var id: ConcordID<Post>
    var date: Int
    var author: Person
}

/// A model on a server whose identity member is `_id` (`--id-key _id`).
struct Doc: ConcordModel, Equatable {
    var id: ConcordID<Doc>
    var title: String
    enum CodingKeys: String, CodingKey {
        case id = "_id"
        case title
    }
}

/// Waits (bounded) for a condition that other threads make true.
func eventually(_ seconds: Double = 10, _ condition: () -> Bool) async -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(5))
    }
    return condition()
}

/// The SDK against a real server process.
@Suite(.serialized)
struct ClientTests {
    @Test func operationsAndTypedErrors() async throws {
        let server = try ServerProcess()
        let c = try await ConcordClient.connect(socketPath: server.socketPath)
        let info = try await c.hello()
        #expect(info.protocolVersion == 1)
        let seq = try await c.update(["id": "Person:1", "name": "Ann"], key: "me")
        #expect(seq == 1)
        #expect(try await c.get(key: "me").model?["name"] == "Ann")
        #expect(try await c.get(id: "Person:1").seq == 1)
        do {
            try await c.collectionRemove("none", at: 3)
            Issue.record("expected bad_index")
        } catch let e as ConcordError {
            #expect(e.code == .badIndex)
        }
        let s = try await c.batch([.update(["id": "A"]), .collectionInsert("c", items: [["id": "A"]])], context: "ctx")
        #expect(s == 2)
        #expect(try await c.get(collection: "c").items == [["id": "A"]])
        #expect(try await c.schema(["Message": ["sender"]]) == ["Message": ["sender"]])
        #expect(try await c.stats()["connections"] == 1)
        c.close()
    }

    @Test func queryProviderFollowsTheWindowAndItsChangesComposeIntoIt() async throws {
        let server = try ServerProcess()
        let c = try await ConcordClient.connect(socketPath: server.socketPath)
        let writer = try await ConcordClient.connect(socketPath: server.socketPath)
        let ann = Person(id: 1, name: "Ann"), bob = Person(id: 2, name: "Bob")
        for (i, a) in [(1, ann), (2, bob), (3, ann), (4, bob), (5, ann)] {
            try await writer.update(try ModelCoding.json(Post(id: .init(String(i)), date: i, author: a)))
        }
        let q = ConcordQuery(Post.self, where: .eq("author.id", "Person:1"), order: [.descending("date")], limit: 2)
        // The SDK sends ConcordProtocol's canonical form (paths as arrays, the offset spelled out).
        #expect(q.json.compactString == #"{"type":"Post","where":{"path":["author","id"],"eq":"Person:1"},"order":[{"path":["date"],"desc":true}],"offset":0,"limit":2}"#)
        let p = try await QueryDataProvider<Post>.open(client: c, query: q)
        #expect(p.data.map(\.date) == [5, 3])
        #expect(p.count == 3)
        // A copy kept up to date with nothing but the change lists.
        let copy = Mutex<[Int]>(p.data.map(\.date))
        let follower = Task {
            for await u in p.changes {
                copy.withLock { list in
                    for change in u.changes {
                        switch change {
                        case .insert(let i): list.insert(u.data[i].date, at: i)
                        case .delete(let i): list.remove(at: i)
                        case .update(let i): list[i] = u.data[i].date
                        case .reset: list = u.data.map(\.date)
                        }
                    }
                }
            }
        }
        try await writer.update(try ModelCoding.json(Post(id: 6, date: 6, author: ann)))       // enters at the top
        try await writer.update(try ModelCoding.json(Post(id: 5, date: 0, author: ann)))       // moves out of the window
        try await writer.update(try ModelCoding.json(Post(id: 3, date: 3, author: bob)))       // leaves: the window refills
        try await writer.update(try ModelCoding.json(Person(id: 1, name: "Ann B.")))          // nested: items update in place
        try await c.ping()   // a barrier: every event up to the rename is applied
        #expect(p.data.map(\.date) == [6, 1])
        #expect(p.count == 3)
        #expect(p.data.allSatisfy { $0.author.name == "Ann B." })
        #expect(await eventually { copy.withLock { $0 } == [6, 1] })
        let read = try await c.get(query: q)
        #expect(read.items.map { $0["date"] } == [6, 1])
        #expect(read.count == 3)
        await p.close()
        follower.cancel()
        c.close()
        writer.close()
    }

    /// A live query the server ends because the views together outgrew
    /// `--max-query-entities`: the provider says why and stops (subscribing
    /// again would only grow again).
    @Test func aQueryEndedForTheEntityCapEndsTheProviderWithTheError() async throws {
        let server = try ServerProcess(arguments: ["--max-query-entities", "10"])
        let c = try await ConcordClient.connect(socketPath: server.socketPath)
        let writer = try await ConcordClient.connect(socketPath: server.socketPath)
        let ann = Person(id: 1, name: "Ann")
        let p = try await QueryDataProvider<Post>.open(client: c, query: ConcordQuery(Post.self, order: [.ascending("date")]))
        let last = Task { () -> QueryProviderUpdate<Post>? in
            var last: QueryProviderUpdate<Post>?
            for await u in p.changes { last = u }
            return last   // the stream ended
        }
        for i in 1...11 {
            try await writer.update(try ModelCoding.json(Post(id: .init(String(i)), date: i, author: ann)))
        }
        let final = await last.value
        #expect(final?.error?.code == .limitExceeded)
        #expect(final?.data.isEmpty == true)
        #expect(p.error?.code == .limitExceeded)
        #expect(p.data.isEmpty)
        c.close()
        writer.close()
    }

    @Test func theIdentityMemberComesFromHello() async throws {
        let server = try ServerProcess(arguments: ["--id-key", "_id"])
        let c = try await ConcordClient.connect(socketPath: server.socketPath)
        #expect(c.idKey == "_id")
        #expect(c.serverInfo?.idKey == "_id")
        let list = try await CollectionDataProvider<Doc>.open(client: c, collection: "docs")
        try await list.setData([Doc(id: 1, title: "a"), Doc(id: 2, title: "b"), Doc(id: 1, title: "a")])
        // Updating an item with the same identity updates that entity: every
        // index holding it, here at once as on the server (found by `_id`).
        try await list.update(Doc(id: 1, title: "A"), at: 0)
        #expect(list.data.map(\.title) == ["A", "b", "A"])
        let stored = try await c.get(collection: "docs").items
        #expect(stored.map { $0["title"]?.stringValue } == ["A", "b", "A"])
        #expect(stored.first?["_id"] == "Doc:1")
        c.close()
    }

    @Test func subscriptionEventsArriveGroupedByMutation() async throws {
        let server = try ServerProcess()
        let c = try await ConcordClient.connect(socketPath: server.socketPath)
        let sub = try await c.subscribe(.ids(["A", "B"]))
        #expect(sub.initial == ["A": .null, "B": .null])
        try await c.batch([.update(["id": "A", "v": 1]), .update(["id": "B", "v": 1])])
        var it = sub.events.makeAsyncIterator()
        guard case .entities(let seq, let list, _)? = await it.next() else {
            Issue.record("expected an entities group")
            return
        }
        #expect(seq == 1)
        #expect(Set(list.map(\.id)) == ["A", "B"])
        c.close()
    }

    @Test func twoProvidersStayConsistentAndTheWriterGetsNoEcho() async throws {
        let server = try ServerProcess()
        let a = try await ConcordClient.connect(socketPath: server.socketPath)
        let b = try await ConcordClient.connect(socketPath: server.socketPath)
        let ann = Person(id: "7", name: "Ann")
        let pa = DataProvider<Message>(client: a)
        let pb = DataProvider<Person>(client: b)
        try await pa.setData(Message(id: "1", text: "hi", sender: ann))
        try await pb.setData(ann)
        #expect(try await a.get(id: "Person:7").model?["name"] == "Ann")  // the wire identity is prefixed
        // B renames Ann: A's message follows; B is not told of its own write.
        try await pb.setData(Person(id: "7", name: "Ann B."))
        #expect(await eventually { pa.data?.sender.name == "Ann B." })
        var updatesA = pa.updates.makeAsyncIterator()
        #expect(await updatesA.next()?.model?.sender.name == "Ann B.")
        // A third party's write reaches both, with its context.
        let c = try await ConcordClient.connect(socketPath: server.socketPath)
        try await c.update(["id": "Person:7", "name": "Ann C."], context: "rename")
        #expect(await eventually { pa.data?.sender.name == "Ann C." && pb.data?.name == "Ann C." })
        var updatesB = pb.updates.makeAsyncIterator()
        let first = await updatesB.next()
        #expect(first?.model?.name == "Ann C.", "B's first update must be the third party's, not an echo of its own write")
        #expect(first?.context == "rename")
        // Paused providers catch up once.
        try await pb.setPaused(true)
        try await c.update(["id": "Person:7", "name": "Ann D."])
        try await c.update(["id": "Person:7", "name": "Ann E."])
        _ = try await b.ping()
        #expect(pb.data?.name == "Ann C.")
        try await pb.setPaused(false)
        #expect(await eventually { pb.data?.name == "Ann E." })
        #expect(try await pa.fetchFromCache(key: "nothing-here") == nil)
    }

    @Test(arguments: [1, 2, 3] as [UInt64])
    func collectionProvidersConvergeAfterRandomOperations(seed: UInt64) async throws {
        let server = try ServerProcess()
        let ca = try await ConcordClient.connect(socketPath: server.socketPath)
        let cb = try await ConcordClient.connect(socketPath: server.socketPath)
        let pa = try await CollectionDataProvider<Person>.open(client: ca, collection: "people")
        let pb = try await CollectionDataProvider<Person>.open(client: cb, collection: "people")
        let checkA = Task { try await Self.checkStream(pa.changes) }
        let checkB = Task { try await Self.checkStream(pb.changes) }
        async let runA: Void = Self.randomOps(pa, seed: seed)
        async let runB: Void = Self.randomOps(pb, seed: seed &+ 99)
        _ = try await (runA, runB)
        try await pa.synchronize()
        try await pb.synchronize()
        let server_ = try await ca.get(collection: "people").items
        let expected = try server_.map { try ModelCoding.model(Person.self, from: $0) }
        #expect(await eventually { pa.data == expected && pb.data == expected })
        await pa.close()
        await pb.close()
        ca.close()
        cb.close()
        // Each stream, applied in order, ended at that provider's data.
        let lastA = try await checkA.value
        let lastB = try await checkB.value
        #expect(lastA == pa.data)
        #expect(lastB == pb.data)
    }

    static func randomOps(_ p: CollectionDataProvider<Person>, seed: UInt64) async throws {
        var rng = SeededRandom(seed: seed)
        for i in 0..<150 {
            let n = p.count
            let person = Person(id: ConcordID("\(Int.random(in: 0..<12, using: &rng))"), name: "n\(i)")
            switch Int.random(in: 0..<10, using: &rng) {
            case 0...3: try? await p.insert([person], at: Int.random(in: 0...n, using: &rng))
            case 4: try? await p.append([person])
            case 5, 6: if n > 0 { try? await p.remove(at: Int.random(in: 0..<n, using: &rng)) }
            case 7, 8: if n > 0 { try? await p.update(person, at: Int.random(in: 0..<n, using: &rng)) }
            default: if i % 50 == 0 { try? await p.setData([person]) }
            }
        }
    }

    /// Applies a change stream to a copy: untouched items must stay where the
    /// changes say, and the count must match; returns the last list seen.
    static func checkStream(_ stream: AsyncStream<CollectionProviderUpdate<Person>>) async throws -> [Person] {
        var copy: [Person?] = []
        var last: [Person] = []
        for await u in stream {
            for c in u.changes {
                switch c {
                case .reset: copy = u.data.map { $0 }
                case .insert(let i):
                    guard i >= 0 && i <= copy.count else { throw TestFailure("insert \(i) outside \(copy.count)") }
                    copy.insert(nil, at: i)
                case .delete(let i):
                    guard i >= 0 && i < copy.count else { throw TestFailure("delete \(i) outside \(copy.count)") }
                    copy.remove(at: i)
                case .update(let i):
                    guard i >= 0 && i < copy.count else { throw TestFailure("update \(i) outside \(copy.count)") }
                    copy[i] = nil
                }
            }
            guard copy.count == u.data.count else { throw TestFailure("count \(copy.count) vs data \(u.data.count)") }
            for (i, p) in copy.enumerated() {
                if let p, p != u.data[i] { throw TestFailure("item \(i) moved without a change") }
            }
            copy = u.data.map { $0 }
            last = u.data
        }
        return last
    }

    @Test func reconnectAfterARestartResynchronizesEverySubscription() async throws {
        let dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("concord-r-\(UUID().uuidString.prefix(8))")
        defer { try? FileManager.default.removeItem(at: dir) }
        let db = dir.appendingPathComponent("db.sqlite").path
        let first = try ServerProcess(arguments: ["--cache", "sqlite", "--cache-path", db], directory: dir)
        let c = try await ConcordClient.connect(socketPath: first.socketPath)
        try await c.update(["id": "P:1", "n": 1], key: "home")
        let sub = try await c.subscribe(.key("home"), keepEveryEvent: true)
        let people = try await CollectionDataProvider<Person>.open(client: c, collection: "people")
        try await people.append([Person(id: "1", name: "Ann")])
        #expect(first.stop() == 0)
        let second = try ServerProcess(arguments: ["--cache", "sqlite", "--cache-path", db], directory: dir)
        _ = second
        let w = try await ConcordClient.connect(socketPath: first.socketPath)
        #expect(await eventually(15) { c.isConnected })
        // Whether these writes land before or after the resubscription, the
        // stream ends at n = 2: a resync with the new value (written before
        // it), or an `unchanged` resubscription (since, nothing shown) and
        // then the update.
        try await w.update(["id": "P:1", "n": 2])
        try await w.collectionInsert("people", items: [["id": "Person:2", "name": "Bob"]])
        var it = sub.events.makeAsyncIterator()
        var latest: JSON?
        var values: [JSON?] = []
        while latest?["n"] != 2 {
            guard let e = await it.next() else { break }
            switch e {
            case .resynced(_, let state): latest = state
            case .update(_, let m, _, _, _): latest = m
            default: break
            }
            values.append(latest?["n"])
        }
        #expect(latest?["n"] == 2)
        // Never a value older than the one held (n = 1 was not sent again).
        #expect(values.allSatisfy { $0 == 2 }, "\(values)")
        let converged = await eventually { people.data.map(\.name) == ["Ann", "Bob"] }
        let server = try await w.get(collection: "people").items
        #expect(converged, "people: \(people.data.map(\.name)), server: \(server)")
        c.close()
    }
}
