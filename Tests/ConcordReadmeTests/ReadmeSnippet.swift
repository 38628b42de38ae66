// The SDK snippet of README.md ("The SDK in ten lines"), verbatim between the
// markers: ReadmeTests checks the README still shows exactly this code and
// runs it against a real server.

// README-SNIPPET-BEGIN
import ConcordClient

struct Person: ConcordModel { var id: ConcordID<Person>; var name: String }
struct Message: ConcordModel { var id: ConcordID<Message>; var text: String; var sender: Person }

func senderAfterRename(socket: String) async throws -> String? {
    let client = try await ConcordClient.connect(socketPath: socket)  // or .connect(): the default socket
    let inbox = DataProvider<Message>(client: client)           // a view: it follows every entity it holds
    try await inbox.setData(Message(id: 1, text: "Hi", sender: Person(id: 7, name: "Ann")))
    let profile = DataProvider<Person>(client: client)          // another view, in this or any other process
    try await profile.setData(Person(id: 7, name: "Ann B."))    // the server rewrites every view holding Person 7
    for await update in inbox.updates { return update.model?.sender.name }  // "Ann B."
    return nil
}
// README-SNIPPET-END

// README-SNIPPET-2-BEGIN
struct Counter: ConcordModel { var id: ConcordID<Counter>; var n: Int }

/// One more on a counter every process shares: read; write only if nothing
/// changed since the read (shown at once by this client's providers, rolled
/// back if refused); on a conflict, read again. No increment is lost.
func increment(_ client: ConcordClient, _ id: ConcordID<Counter>) async throws -> Int {
    while true {
        let (stored, seq) = try await client.get(id: Counter(id: id, n: 0).globalIdentity)
        var next = try stored.map { try ModelCoding.model(Counter.self, from: $0) } ?? Counter(id: id, n: 0)
        next.n += 1
        let json = try ModelCoding.json(next)
        do {
            _ = try await client.optimistic([.update(json)]) { try await client.update(json, ifUnchangedSince: seq) }
            return next.n
        } catch let e as ConcordError where e.code == .conflict {
            continue  // someone wrote it after our read
        }
    }
}
// README-SNIPPET-2-END
