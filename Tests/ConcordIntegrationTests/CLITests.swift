import ConcordJSON
import ConcordTestServer
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension String {
    var json: JSON? { try? JSONParser().parse(self) }
}

/// The `concord` CLI as spawned processes against a real server.
@Suite(.serialized)
struct CLITests {
    static var binary: String { ServerProcess.binary.deletingLastPathComponent().appendingPathComponent("concord").path }

    /// Runs `concord args…` (stdin optional); returns status, stdout, stderr.
    static func concord(_ args: [String], socket: String, stdin: String? = nil) throws -> (Int32, String, String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binary)
        p.arguments = args
        var env = ProcessInfo.processInfo.environment
        env["CONCORD_SOCKET"] = socket
        p.environment = env
        let out = Pipe(), err = Pipe(), inp = Pipe()
        p.standardOutput = out
        p.standardError = err
        p.standardInput = inp
        try p.run()
        if let stdin { inp.fileHandleForWriting.write(Data(stdin.utf8)) }
        try inp.fileHandleForWriting.close()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
    }

    @Test func everydayCommands() throws {
        let server = try ServerProcess()
        let s = server.socketPath
        #expect(try Self.concord(["ping"], socket: s).1 == "0\n")
        // --socket before or after the subcommand; it wins over CONCORD_SOCKET.
        #expect(try Self.concord(["--socket", s, "ping"], socket: "/nonexistent.sock").1 == "0\n")
        #expect(try Self.concord(["ping", "--socket", s], socket: "/nonexistent.sock").1 == "0\n")
        let hello = try Self.concord(["hello"], socket: s).1
        #expect(hello.contains("\"protocol\":1"))
        #expect(try Self.concord(["update", #"{"id":"P:1","n":1}"#, "--key", "home"], socket: s).1 == "1\n")
        #expect(try Self.concord(["update", "-", "--merge", "--context", #"{"by":"cli"}"#], socket: s, stdin: #"{"id":"P:1","m":2}"#).1 == "2\n")
        #expect(try Self.concord(["get", "--key", "home"], socket: s).1 == #"{"id":"P:1","n":1,"m":2}"# + "\n")
        #expect(try Self.concord(["get", "--id", "P:1"], socket: s).1 == #"{"id":"P:1","n":1,"m":2}"# + "\n")
        let batch = #"{"op":"update","model":{"id":"A"}}"# + "\n" + #"{"op":"collection.insert","collection":"c","items":[{"id":"A"},{"id":"B"}]}"# + "\n"
        #expect(try Self.concord(["batch", "-"], socket: s, stdin: batch).1 == "3\n")
        #expect(try Self.concord(["collection", "remove", "c", "--index", "0"], socket: s).0 == 0)
        #expect(try Self.concord(["collection", "insert", "c", #"{"id":"Z"}"#, "--index", "0"], socket: s).0 == 0)
        #expect(try Self.concord(["get", "--collection", "c"], socket: s).1 == #"[{"id":"Z"},{"id":"B"}]"# + "\n")
        #expect(try Self.concord(["collection", "set", "c", "[]"], socket: s).0 == 0)
        #expect(try Self.concord(["collection", "delete", "c"], socket: s).0 == 0)
        #expect(try Self.concord(["delete", "--id", "A"], socket: s).0 == 0)
        #expect(try Self.concord(["schema", "--required", #"{"Msg":["from"]}"#], socket: s).1 == #"{"Msg":["from"]}"# + "\n")
        let stats = try Self.concord(["stats", "--json"], socket: s).1
        let v = try JSONParser().parse(stats.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(v["seq"]?.numberValue?.intValue == 8)
        let table = try Self.concord(["stats"], socket: s).1
        #expect(table.contains("memory.allocated"))
    }

    /// Conditional writes, tokens, `sync` and `subscribe --since` from the command line.
    @Test func conditionalWritesTokensSyncAndSince() throws {
        let server = try ServerProcess()
        let s = server.socketPath
        #expect(try Self.concord(["update", #"{"id":"C:1","n":1}"#], socket: s).1 == "1\n")
        #expect(try Self.concord(["update", #"{"id":"C:1","n":2}"#, "--if-unchanged-since", "1"], socket: s).1 == "2\n")
        let (status, _, err) = try Self.concord(["update", #"{"id":"C:1","n":3}"#, "--if-unchanged-since", "1"], socket: s)
        #expect(status != 0)
        #expect(err.contains("conflict"))
        #expect(try Self.concord(["update", #"{"id":"C:1","n":4}"#, "--token", "t1"], socket: s).1 == "3\n")
        #expect(try Self.concord(["update", #"{"id":"C:1","n":5}"#, "--token", "t1"], socket: s).1 == "3\n")
        #expect(try Self.concord(["sync"], socket: s).1 == "3\n")
        // subscribe --since: the answer says unchanged, then events as usual.
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Self.binary)
        p.arguments = ["subscribe", "--ids", "C:1", "--since", "3", "--initial", "--count", "1", "--socket", s]
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        let c = try server.connect()
        try waitUntil("the subscription exists") { try c.request(#"{"op":"stats"}"#)["subscriptions"] == 1 }
        try c.request(#"{"op":"update","model":{"id":"C:1","n":6}}"#)
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let lines = String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
        #expect(lines.first?.json == #"{"seq":3,"unchanged":true}"#.json)
        #expect(lines.count == 2)
        #expect(lines.last?.json?["model"]?["n"] == 6)
    }

    @Test func errorsGoToStderrWithAFailingStatus() throws {
        let server = try ServerProcess()
        let (status, out, err) = try Self.concord(["collection", "remove", "nope", "--index", "3"], socket: server.socketPath)
        #expect(status != 0)
        #expect(out.isEmpty)
        #expect(err.contains("bad_index"))
        let (s2, _, e2) = try Self.concord(["ping"], socket: server.socketPath + ".missing")
        #expect(s2 != 0)
        #expect(e2.contains("cannot connect"))
        let (s3, _, _) = try Self.concord(["update", "{not json"], socket: server.socketPath)
        #expect(s3 != 0)
    }

    @Test func queriesFromTheCommandLine() throws {
        let server = try ServerProcess()
        let s = server.socketPath
        let c = try server.connect()
        for i in 1...3 { try c.request(#"{"op":"update","model":{"id":"Post:\#(i)","date":\#(i)}}"#) }
        let query = #"{"type":"Post","order":[{"path":"date","desc":true}],"limit":2}"#
        #expect(try Self.concord(["get", "--query", query], socket: s).1
                == #"{"items":[{"id":"Post:3","date":3},{"id":"Post:2","date":2}],"count":3}"# + "\n")
        let bad = try Self.concord(["get", "--query", #"{"type":"Post","limit":0}"#], socket: s)
        #expect(bad.0 != 0 && bad.2.contains("bad_request"))
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Self.binary)
        p.arguments = ["subscribe", "--query", query, "--count", "1", "--socket", s]
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        var subscribed = false
        for _ in 0..<500 {
            if try c.request(#"{"op":"stats"}"#)["subscriptions"] == 1 { subscribed = true; break }
            usleep(10_000)
        }
        #expect(subscribed)
        try c.request(#"{"op":"update","model":{"id":"Post:9","date":9}}"#)
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let line = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        let e = try JSONParser().parse(line)
        #expect(e["event"] == "query")
        #expect(e["count"] == 4)
        #expect(e["changes"] == #"[{"op":"insert","index":0,"items":[{"id":"Post:9","date":9}]},{"op":"remove","index":2,"count":1}]"#.json)
    }

    @Test func subscribePrintsEachEventAndStopsAfterCount() throws {
        let server = try ServerProcess()
        let s = server.socketPath
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Self.binary)
        p.arguments = ["subscribe", "--ids", "A,B", "--count", "3", "--socket", s]
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        // Wait until the subscription exists, then write.
        let c = try server.connect()
        var subscribed = false
        for _ in 0..<500 {
            if try c.request(#"{"op":"stats"}"#)["subscriptions"] == 1 { subscribed = true; break }
            usleep(10_000)
        }
        #expect(subscribed)
        try c.request(#"{"op":"batch","ops":[{"op":"update","model":{"id":"A","v":1}},{"op":"update","model":{"id":"B","v":1}}]}"#)
        try c.request(#"{"op":"delete","id":"A"}"#)
        try c.request(#"{"op":"update","model":{"id":"B","v":9}}"#)
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        let lines = String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
        #expect(lines.count == 3)
        let events = try lines.map { try JSONParser().parse($0) }
        #expect(events.allSatisfy { $0["event"] == "entity" })
        #expect(events[2]["id"] == "A")
        #expect(events[2]["model"] == .null)
    }
}

/// The operator's view: `{"op":"stats","clients":true}` and `concord clients`.
@Suite(.serialized)
struct OperatorViewTests {
    @Test func statsListsEveryConnectionWithWhoItIsAndHowFarBehind() throws {
        let server = try ServerProcess(arguments: ["--output-soft-bytes", "16384", "--max-output-bytes", "65536"])
        let named = try server.connect()
        try named.request(#"{"op":"hello","client":"inbox-app"}"#)
        let slow = try server.connect()
        try slow.request(#"{"op":"subscribe","sub":"k","key":"k"}"#)
        let writer = try server.connect()
        let blob = String(repeating: "y", count: 4000)
        for i in 0..<100 { try writer.request(#"{"op":"update","key":"k","model":{"id":"K","v":\#(i),"b":"\#(blob)"}}"#) }
        let list = try named.request(#"{"op":"stats","clients":true}"#)["clients"]?.arrayValue ?? []
        #expect(list.count == 3)
        let me = list.first { $0["name"] == "inbox-app" }
        #expect(me?["pid"] == .int(Int(getpid())))
        #expect(me?["uid"] == .int(Int(getuid())))
        #expect((me?["requests"]?.numberValue?.intValue ?? 0) >= 2)
        #expect((me?["age_ms"]?.numberValue?.intValue ?? -1) >= 0)
        let lagging = list.first { $0["subscriptions"] == 1 }
        #expect(lagging?["coalescing"] == true, "\(lagging?.compactString ?? "none")")
        #expect((lagging?["unsent_bytes"]?.numberValue?.intValue ?? 0) > 0)
        #expect(list.first { $0["requests"] == 100 }?["coalescing"] == false)
        // Without `clients`, stats stays as it was.
        #expect(try named.request(#"{"op":"stats"}"#)["clients"] == nil)
        // The CLI shows the same, one row per connection (its own included).
        let (status, out, _) = try CLITests.concord(["clients"], socket: server.socketPath)
        #expect(status == 0)
        #expect(out.contains("inbox-app"))
        #expect(out.contains("concord-cli"))
        #expect(out.split(separator: "\n").count == 5)  // header + 4 connections
        #expect(server.stop() == 0)
    }
}
