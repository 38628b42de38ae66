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
