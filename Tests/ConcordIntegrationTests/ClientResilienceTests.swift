import ConcordClient
import ConcordJSON
import ConcordTestServer
import Foundation
import Synchronization
import Testing

/// The SDK through a connection that drops (PROTOCOL §3.2, §4.1): a
/// mutation whose answer was lost is retried with its token and applies
/// once; views come back with `since` and keep their value when nothing
/// changed; a feed gets what it missed.
@Suite(.serialized)
struct ClientResilienceTests {
    func client(through proxy: DropProxy) async throws -> ConcordClient {
        var config = ConcordClient.Configuration(socketPath: proxy.path)
        config.initialBackoff = .milliseconds(10)
        config.maxBackoff = .milliseconds(50)
        // Generous: under a sanitizer with every suite running, a reconnect can take seconds.
        config.retryTimeout = .seconds(120)
        return try await ConcordClient.connect(config)
    }

    @Test func aMutationWhoseAnswerWasLostAppliesOnce() async throws {
        let server = try ServerProcess()
        let proxy = try DropProxy(target: server.socketPath)
        defer { proxy.stop() }
        let c = try await client(through: proxy)
        let direct = try await ConcordClient.connect(socketPath: server.socketPath)
        try await direct.update(["id": "Other:1"])  // seq 1
        proxy.dropAfterForwarding(lineContaining: "collection.insert")
        // The insert reaches the server, its answer does not; the client
        // reconnects and sends it again with the same token.
        let seq = try await c.collectionInsert("c", items: [["id": "I:1"]])
        #expect(proxy.drops.load(ordering: .relaxed) == 1)
        #expect(seq == 2)
        #expect(try await direct.get(collection: "c").items == [["id": "I:1"]])
        #expect(try await direct.ping() == 2)
        c.close()
        direct.close()
    }

    @Test func aConditionalWriteOnAStaleReadThrowsATypedConflict() async throws {
        let server = try ServerProcess()
        let a = try await ConcordClient.connect(socketPath: server.socketPath)
        let b = try await ConcordClient.connect(socketPath: server.socketPath)
        let read = try await a.update(["id": "Doc:1", "n": 1])
        try await b.update(["id": "Doc:1", "n": 2])
        do {
            try await a.update(["id": "Doc:1", "n": 3], ifUnchangedSince: read)
            Issue.record("expected a conflict")
        } catch let e as ConcordError {
            #expect(e.code == .conflict)
            #expect(e.conflict == ConcordError.Conflict(seq: 2, entities: ["Doc:1"], keys: [], collections: []))
        }
        #expect(try await a.get(id: "Doc:1").model?["n"] == 2)
        #expect(try await a.update(["id": "Doc:1", "n": 3], ifUnchangedSince: 2) == 3)
        // The same token twice: applied once, the original seq both times.
        #expect(try await a.update(["id": "Doc:1", "n": 4], token: "mine") == 4)
        #expect(try await b.update(["id": "Doc:1", "n": 5], token: "mine") == 4)
        #expect(try await a.get(id: "Doc:1").model?["n"] == 4)
        a.close()
        b.close()
    }

    final class Tally: Sendable { let n = Atomic<Int>(0) }

    /// Reads the counter, writes it plus one if unchanged since the read; on a conflict, again.
    static func increment(_ c: ConcordClient, times: Int, conflicts: Tally) async throws {
        for _ in 0..<times {
            while true {
                let (model, seq) = try await c.get(id: "Counter:1")
                let n = model?["n"]?.numberValue?.intValue ?? 0
                do {
                    try await c.update(["id": "Counter:1", "n": .int(n + 1)], ifUnchangedSince: seq)
                    break
                } catch let e as ConcordError where e.code == .conflict {
                    conflicts.n.add(1, ordering: .relaxed)
                }
            }
        }
    }

    /// The read-modify-write loop of the README: two clients increment one
    /// counter 500 times each, retrying on conflict; no increment is lost.
    @Test func readModifyWriteIncrementsWithConflictRetriesLoseNothing() async throws {
        let server = try ServerProcess()
        let setup = try await ConcordClient.connect(socketPath: server.socketPath)
        try await setup.update(["id": "Counter:1", "n": 0])
        let conflicts = Tally()
        let a = try await ConcordClient.connect(socketPath: server.socketPath)
        let b = try await ConcordClient.connect(socketPath: server.socketPath)
        async let x: Void = Self.increment(a, times: 500, conflicts: conflicts)
        async let y: Void = Self.increment(b, times: 500, conflicts: conflicts)
        _ = try await (x, y)
        #expect(try await setup.get(id: "Counter:1").model?["n"] == 1000)
        print("read-modify-write: \(conflicts.n.load(ordering: .relaxed)) conflicts retried for 1,000 increments")
        a.close()
        b.close()
        setup.close()
    }

    @Test func viewsComeBackWithSinceAndKeepTheirValueWhenNothingChanged() async throws {
        let server = try ServerProcess()
        var proxy = try DropProxy(target: server.socketPath)
        let c = try await client(through: proxy)
        let direct = try await ConcordClient.connect(socketPath: server.socketPath)
        try await direct.update(["title": "t"], key: "home")
        let home = try await c.subscribe(.key("home"))
        let feed = try await c.subscribe(.feed(types: ["Note"]))
        let homeEvents = Mutex<[ConcordEvent]>([])
        let feedIDs = Mutex<[String]>([])
        let t1 = Task { for await e in home.events { homeEvents.withLock { $0.append(e) } } }
        let t2 = Task {
            for await e in feed.events {
                if case .entities(_, let changes, _) = e { feedIDs.withLock { $0.append(contentsOf: changes.map(\.id)) } }
            }
        }
        // The connections the server holds, by id, with their subscription counts.
        func connections() async throws -> [(id: Int, subs: Int)] {
            let list = try await direct.stats(clients: true)["clients"]?.arrayValue ?? []
            return list.map { ($0["id"]?.numberValue?.intValue ?? 0, $0["subscriptions"]?.numberValue?.intValue ?? 0) }
        }
        /// Waits until a connection newer than `id` holds both subscriptions again.
        func resubscribed(after id: Int) async throws -> Bool {
            for _ in 0..<1000 {
                if try await connections().contains(where: { $0.id > id && $0.subs == 2 }) { return true }
                try await Task.sleep(for: .milliseconds(10))
            }
            return false
        }
        let before = try await connections().map(\.id).max() ?? 0

        // Dropped and back with nothing changed: no event, the value kept.
        proxy.dropAll()
        #expect(try await resubscribed(after: before))
        _ = try await c.ping()
        #expect(homeEvents.withLock { $0.isEmpty })

        // Away while things change: the view gets its new value once, the
        // feed the notes it missed (replayed from the server's history).
        proxy.stop()
        #expect(await eventually { !c.isConnected })
        try await direct.update(["id": "Note:1", "text": "a"])
        try await direct.update(["id": "Note:2", "text": "b"])
        try await direct.update(["title": "u"], key: "home")
        proxy = try DropProxy(target: server.socketPath)
        defer { proxy.stop() }
        #expect(await eventually(10) { feedIDs.withLock { $0 } == ["Note:1", "Note:2"] })
        #expect(await eventually(10) {
            homeEvents.withLock { list in
                list.contains { if case .resynced(_, let state) = $0 { return state["title"] == "u" } else { return false } }
            }
        })
        t1.cancel()
        t2.cancel()
        c.close()
        direct.close()
    }
}
