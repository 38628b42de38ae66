import ConcordClient
import ConcordJSON
import ConcordTestServer
import Foundation
import Synchronization
import Testing

/// `client.optimistic { … }`: a change shown by every provider at once, the
/// server's events applied underneath, dropped when its mutation is answered
/// (the server's value then) or rolled back when it fails.
@Suite(.serialized)
struct OptimisticTests {
    @Test func aLayerShowsAtOnceAndGivesWayToTheServersValue() async throws {
        let server = try ServerProcess()
        let c = try await ConcordClient.connect(socketPath: server.socketPath)
        let other = try await ConcordClient.connect(socketPath: server.socketPath)
        let ann = Person(id: "1", name: "Ann")
        let message = DataProvider<Message>(client: c)
        try await message.setData(Message(id: "1", text: "hi", sender: ann))
        let list = try await CollectionDataProvider<Person>.open(client: c, collection: "people")
        try await list.setData([ann, Person(id: "2", name: "Bob")])
        let seen = try await c.ping()
        let steps = Mutex<[String]>([])
        let follower = Task {
            for await u in message.updates { steps.withLock { $0.append("\(u.model?.sender.name ?? "-")\(u.optimistic ? "*" : "")") } }
        }
        let renamed: JSON = ["id": "Person:1", "name": "Ann B."]
        let seq = try await c.optimistic([.update(renamed)]) {
            // Shown everywhere on this client before the server has it.
            #expect(message.data?.sender.name == "Ann B.")
            #expect(list.data.map(\.name) == ["Ann B.", "Bob"])
            return try await c.update(renamed, ifUnchangedSince: seen)
        }
        #expect(seq == seen + 1)
        // Answered: the server's value, which is the same.
        #expect(message.data?.sender.name == "Ann B.")
        #expect(list.data.map(\.name) == ["Ann B.", "Bob"])
        #expect(await eventually { steps.withLock { $0.last } == "Ann B." })

        // A refused write rolls back; a change made meanwhile by someone else
        // to another entity shows underneath, the layer on top.
        let stale: JSON = ["id": "Person:1", "name": "Ann X."]
        do {
            _ = try await c.optimistic([.update(stale), .delete(id: "Person:2")]) {
                #expect(message.data?.sender.name == "Ann X.")
                #expect(list.data.map(\.name) == ["Ann X."])
                try await other.update(["id": "Message:1", "text": "edited", "sender": ["id": "Person:1", "name": "Ann B."]])
                _ = try await c.ping()  // the event is in: applied under the layer
                #expect(message.data?.text == "edited")
                #expect(message.data?.sender.name == "Ann X.")
                // The layer holds while this closure runs: a provider's follower sees it
                // (waited for here, not checked after the fact: a busy machine may deliver late).
                #expect(await eventually { steps.withLock { $0.last } == "Ann X.*" })
                return try await c.update(stale, ifUnchangedSince: seen)  // Person:1 changed since: conflict
            }
            Issue.record("expected a conflict")
        } catch let e as ConcordError {
            #expect(e.code == .conflict)
        }
        // Rolled back to the server's state.
        #expect(message.data?.sender.name == "Ann B.")
        #expect(message.data?.text == "edited")
        #expect(list.data.map(\.name) == ["Ann B.", "Bob"])
        // Every step the providers showed was the server's state or the server's plus the layer.
        #expect(await eventually { steps.withLock { $0.last } == "Ann B." })
        let shown = steps.withLock { $0 }
        #expect(shown.allSatisfy { ["Ann B.", "Ann B.*", "Ann X.*"].contains($0) }, "\(shown)")
        follower.cancel()
        c.close()
        other.close()
    }
}
