import ConcordJSON
import ConcordTestSupport
import ConcordTestServer
import Foundation
import Testing

/// Nothing a client sends may crash the server or cost another client its
/// connection: random bytes and requests with members of random types, each
/// answered by exactly one response, while a bystander keeps working.
@Suite(.serialized)
struct RobustnessTests {
    static let ops = ["hello", "ping", "get", "subscribe", "unsubscribe", "pause", "resume", "schema", "stats",
                      "update", "delete", "batch", "collection.set", "collection.insert", "collection.remove",
                      "collection.delete", "nope"]
    static let members = ["rid", "sub", "key", "id", "collection", "model", "ids", "feed", "mode", "force", "refresh",
                          "items", "index", "count", "ops", "required", "context", "origin", "op"]

    static func randomValue(_ rng: inout SeededRandom, depth: Int = 0) -> String {
        switch Int.random(in: 0..<(depth > 3 ? 6 : 9), using: &rng) {
        case 0: return "null"
        case 1: return Bool.random(using: &rng) ? "true" : "false"
        case 2: return String(Int.random(in: -3...20, using: &rng))
        case 3: return ["1.5", "-0", "1e400", "0.1", "12345678901234567890"].randomElement(using: &rng)!
        case 4: return "\"" + ["", "a", "s1", "P:1", "k", "Msg", "\\u00e9", "x\\ny"].randomElement(using: &rng)! + "\""
        case 5: return "\"" + Self.ops.randomElement(using: &rng)! + "\""
        case 6:
            let n = Int.random(in: 0..<4, using: &rng)
            return "[" + (0..<n).map { _ in randomValue(&rng, depth: depth + 1) }.joined(separator: ",") + "]"
        default:
            let n = Int.random(in: 0..<4, using: &rng)
            var parts: [String] = []
            if Bool.random(using: &rng) { parts.append(#""id":"\#(["P:1", "P:2", "M:1"].randomElement(using: &rng)!)""#) }
            for _ in 0..<n { parts.append("\"\(Self.members.randomElement(using: &rng)!)\":\(randomValue(&rng, depth: depth + 1))") }
            return "{" + parts.joined(separator: ",") + "}"
        }
    }

    @Test(arguments: StressTests.soak ? Array(1...40) : [1, 2] as [UInt64])
    func randomRequestsAndBytesNeverCrashTheServer(seed: UInt64) throws {
        let server = try ServerProcess(arguments: ["--max-depth", "16", "--max-line-bytes", "4096"], environment: internalChecks)
        let bystander = try server.connect()
        try bystander.request(#"{"op":"subscribe","sub":"watch","key":"k"}"#)
        let c = try server.connect()
        var rng = SeededRandom(seed: seed)
        var expected = 0
        for round in 0..<40 {
            var batch: [UInt8] = []
            for _ in 0..<100 {
                switch Int.random(in: 0..<10, using: &rng) {
                case 0:
                    // Raw garbage without a newline inside, then a newline.
                    let n = Int.random(in: 1..<64, using: &rng)
                    var bytes = (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) }
                    bytes.removeAll { $0 == 0x0A }
                    if bytes.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }) { bytes.append(UInt8(ascii: "x")) }
                    batch += bytes + [0x0A]
                case 1:
                    batch += Array(String(repeating: "[", count: Int.random(in: 10...40, using: &rng)).utf8) + [0x0A]
                default:
                    var fields = [#""op":"\#(Self.ops.randomElement(using: &rng)!)""#]
                    for _ in 0..<Int.random(in: 0..<5, using: &rng) {
                        fields.append("\"\(Self.members.randomElement(using: &rng)!)\":\(Self.randomValue(&rng))")
                    }
                    batch += Array(("{" + fields.joined(separator: ",") + "}").utf8) + [0x0A]
                }
                expected += 1
            }
            try c.write(batch)
            if round % 10 == 9 {
                #expect(try bystander.request(#"{"op":"ping"}"#)["ok"] == true)
            }
        }
        // Exactly one response per line (events for its own subscriptions aside).
        var responses = 0
        while responses < expected {
            let r = try c.response()
            #expect(r["ok"] != nil)
            responses += 1
        }
        #expect(try c.request(#"{"op":"ping","rid":"end"}"#)["rid"] == "end")
        #expect(try bystander.request(#"{"op":"ping"}"#)["ok"] == true)
        #expect(server.process.isRunning)
        #expect(server.stop() == 0)
    }
}
