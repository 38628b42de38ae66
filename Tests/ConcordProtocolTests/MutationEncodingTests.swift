import ConcordJSON
import Testing

@testable import ConcordProtocol

/// The encoder (Mutation+Encoding.swift, used by the SDK) and the decoder
/// (Request.swift, used by the server) speak the same vocabulary.
struct MutationEncodingTests {
    static let person: JSON = ["id": "Person:7", "name": "Ann"]

    static let samples: [Mutation] = [
        .update(model: person, key: nil, mode: .replace, force: false),
        .update(model: person, key: "inbox", mode: .merge, force: true),
        .deleteEntity("Person:7"),
        .deleteKey("inbox"),
        .collectionSet(name: "feed", items: [person]),
        .collectionInsert(name: "feed", index: nil, items: [person]),
        .collectionInsert(name: "feed", index: 0, items: [person, person]),
        .collectionRemoveAt(name: "feed", index: 2, count: 1),
        .collectionRemoveAt(name: "feed", index: 2, count: 3),
        .collectionRemoveIDs(name: "feed", ids: ["Person:7", "Person:8"]),
        .collectionDelete(name: "feed"),
        .clear,
        .batch([
            (.update(model: person, key: nil, mode: .replace, force: false), origin: "s1"),
            (.deleteKey("inbox"), origin: nil),
            (.collectionRemoveIDs(name: "feed", ids: ["Person:7"]), origin: nil),
        ]),
    ]

    @Test(arguments: samples)
    func whatTheClientEncodesTheServerDecodesAsTheSameMutation(_ m: Mutation) throws {
        var object = m.requestObject()
        MutationOptions(context: ["why": "test"], origin: "s2").encode(into: &object)
        object["rid"] = 1
        let request = try Request.decode(.object(object), idKey: "id")
        guard case .mutation(let decoded, let options) = request.op else {
            Issue.record("decoded as \(request.op), not a mutation")
            return
        }
        // Equal encodings: the mutation has no Equatable, its request object does.
        #expect(JSON.object(decoded.requestObject()).compactString == JSON.object(m.requestObject()).compactString)
        #expect(decoded.opName == m.opName)
        #expect(options.origin == "s2")
        #expect(options.context == ["why": "test"])
    }

    @Test func opNamesAreTheOnesTheMetricsCount() {
        for m in Self.samples { #expect(Operation.metricNames.contains(m.opName)) }
    }
}
