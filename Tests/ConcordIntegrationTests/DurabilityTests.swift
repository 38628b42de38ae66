import ConcordJSON
import ConcordTestServer
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 9, durability: nothing acknowledged is lost, failures are said
/// plainly, `seq` never goes backwards. The SQLite backend's `fault_file`
/// makes every write fail while the file exists (a full disk, on command).
@Suite(.serialized)
struct DurabilityTests {
    static func sqliteArgs(_ extra: [String] = []) -> (args: [String], db: String, fault: String) {
        let db = PersistenceTests.tempPath("c.sqlite")
        let fault = db + ".fault"
        let config = #"{"fault_file":"\#(fault)"}"#
        return (["--cache", "sqlite", "--cache-path", db, "--cache-config", config] + extra, db, fault)
    }

    static func waitFor(_ what: String, timeout: Double = 15, _ condition: () throws -> Bool) throws {
        try waitUntil(what, timeout: timeout, condition)
    }

    @Test func syncShutdownUnderAPipelinedWriterAnswersEverythingReadAndLosesNoAck() throws {
        let (args, _, _) = Self.sqliteArgs(["--durability", "sync"])
        var acked: [Int: Int] = [:]
        var answered = 0
        let total = 20_000
        do {
            let server = try ServerProcess(arguments: args)
            let c = try server.connect()
            var text = ""
            for i in 0..<total { text += #"{"op":"update","model":{"id":"E:\#(i % 100)","v":\#(i)},"rid":\#(i)}"# + "\n" }
            let bytes = Array(text.utf8)
            let writer = Thread { try? c.write(bytes) }
            writer.start()
            // Some acknowledgements, then SIGTERM while the writer is still going.
            for i in 0..<500 {
                let r = try c.response()
                #expect(r["rid"] == .int(i))
                acked[i % 100] = i
                answered += 1
            }
            kill(server.process.processIdentifier, SIGTERM)
            // Every request the server read is answered, in order, then EOF.
            var expectRid = 500
            var shuttingDown = 0
            // The server closes with the writer's unread bytes in its socket:
            // the end may read as ECONNRESET rather than EOF.
            while let line = try? c.readJSON() {
                guard line["event"] == nil else { continue }
                #expect(line["rid"] == .int(expectRid), "a read request went unanswered before rid \(expectRid)")
                expectRid += 1
                if line["ok"] == true {
                    let rid = line["rid"]!.numberValue!.intValue!
                    acked[rid % 100] = max(acked[rid % 100] ?? -1, rid)
                } else {
                    #expect(line["error"]?["code"] == "shutting_down")
                    shuttingDown += 1
                }
            }
            answered = expectRid
            #expect(answered > 500, "nothing was answered after the signal")
            try Self.waitFor("the server to exit") { !server.process.isRunning }
            #expect(server.process.terminationStatus == 0)
            print("sync shutdown: \(answered) answered, \(shuttingDown) shutting_down")
        }
        #expect(!acked.isEmpty)
        let server = try ServerProcess(arguments: args)
        let c = try server.connect()
        for e in 0..<100 {
            // Exactly the last acknowledged value: nothing acknowledged is lost,
            // and nothing was applied without an answer.
            let got = try c.request(#"{"op":"get","id":"E:\#(e)"}"#)["model"]?["v"]?.numberValue?.intValue ?? -1
            #expect(got == acked[e] ?? -1, "E:\(e): last acknowledged \(acked[e] ?? -1), after restart \(got)")
        }
        #expect(server.stop() == 0)
    }

    @Test func seqNeverGoesBackwardsAcrossKillNineInAsyncMode() throws {
        let (args, _, _) = Self.sqliteArgs()
        var highest = 0
        do {
            let server = try ServerProcess(arguments: args)
            let c = try server.connect()
            for i in 0..<3000 { try c.send(#"{"op":"update","model":{"id":"E:\#(i % 10)","v":\#(i)}}"#) }
            for _ in 0..<3000 { highest = max(highest, try c.response()["seq"]?.numberValue?.intValue ?? 0) }
            kill(server.process.processIdentifier, SIGKILL)
            server.process.waitUntilExit()
        }
        #expect(highest == 3000)
        do {
            let server = try ServerProcess(arguments: args)
            let c = try server.connect()
            let seq = try c.request(#"{"op":"update","model":{"id":"E:x"}}"#)["seq"]?.numberValue?.intValue ?? 0
            #expect(seq > highest, "seq \(seq) after a crash; clients had seen \(highest)")
            highest = seq
            // A clean stop keeps no gap: the next start continues at seq + 1.
            #expect(server.stop() == 0)
        }
        let server = try ServerProcess(arguments: args)
        let c = try server.connect()
        #expect(try c.request(#"{"op":"ping"}"#)["seq"] == .int(highest))
        #expect(try c.request(#"{"op":"update","model":{"id":"E:y"}}"#)["seq"] == .int(highest + 1))
        #expect(server.stop() == 0)
    }

    @Test func asyncWritesSurviveAFailingBackendAndAreStoredWhenItRecovers() throws {
        let (args, _, fault) = Self.sqliteArgs(["--max-unstored-records", "500"])
        do {
            let server = try ServerProcess(arguments: args)
            let c = try server.connect()
            try c.request(#"{"op":"update","model":{"id":"A","v":0}}"#)
            #expect(FileManager.default.createFile(atPath: fault, contents: nil))
            // Acknowledged while failing (under the limit): kept and retried.
            for i in 1...100 { #expect(try c.request(#"{"op":"update","model":{"id":"E:\#(i)","v":\#(i)}}"#)["ok"] == true) }
            // The storage thread takes the writes behind the acknowledgements: wait for it.
            try Self.waitFor("the failing state and the whole backlog in stats") {
                let s = try c.request(#"{"op":"stats"}"#)["cache"]!
                return s["state"] == "failing" && (s["backlog"]?.numberValue?.intValue ?? 0) >= 100
            }
            // Over the limit: refused, nothing applied.
            var refused: JSON = .null
            for i in 101...700 {
                let r = try c.request(#"{"op":"update","model":{"id":"E:\#(i)","v":\#(i)}}"#)
                if r["ok"] == false { refused = r; break }
            }
            #expect(refused["error"]?["code"] == "cache_error")
            let seqBefore = try c.request(#"{"op":"ping"}"#)["seq"]
            #expect(try c.request(#"{"op":"update","model":{"id":"X","v":1}}"#)["ok"] == false)
            #expect(try c.request(#"{"op":"ping"}"#)["seq"] == seqBefore)
            // The disk has room again: the backlog drains, writes are accepted.
            try FileManager.default.removeItem(atPath: fault)
            try Self.waitFor("the backlog to drain") {
                let s = try c.request(#"{"op":"stats"}"#)["cache"]!
                return s["state"] == "ok" && s["backlog"] == 0
            }
            #expect(try c.request(#"{"op":"update","model":{"id":"X","v":1}}"#)["ok"] == true)
            #expect(server.stop() == 0)
            // One line for the episode, one for the recovery: not one per record.
            let failures = server.stderr.components(separatedBy: "failed to store").count - 1
            #expect(failures == 1, "\(failures) failure lines")
            #expect(server.stderr.contains("stores again"))
        }
        let server = try ServerProcess(arguments: args)
        let c = try server.connect()
        for i in 1...100 {
            #expect(try c.request(#"{"op":"get","id":"E:\#(i)"}"#)["model"]?["v"] == .int(i))
        }
        #expect(try c.request(#"{"op":"get","id":"X"}"#)["model"]?["v"] == 1)
        #expect(server.stop() == 0)
    }

    @Test func syncWritesWaitForTheBackendAndSayPlainlyWhenNotDurable() throws {
        let (args, _, fault) = Self.sqliteArgs(["--durability", "sync", "--sync-timeout", "1"])
        do {
            let server = try ServerProcess(arguments: args)
            let c = try server.connect()
            let watcher = try server.connect()
            try watcher.request(#"{"op":"subscribe","sub":"a","ids":["A"]}"#)
            #expect(try c.request(#"{"op":"update","model":{"id":"A","v":1}}"#)["durable"] == nil)
            #expect(FileManager.default.createFile(atPath: fault, contents: nil))
            // Applied, but the backend cannot store it: after --sync-timeout the
            // answer says so, with its seq. The event waited as long.
            let r = try c.request(#"{"op":"update","model":{"id":"A","v":2}}"#)
            #expect(r["ok"] == true)
            #expect(r["seq"] == 2)
            #expect(r["durable"] == false)
            #expect(r["warning"]?["code"] == "cache_error")
            let pong = try watcher.request(#"{"op":"ping"}"#)
            #expect(pong["seq"] == 2)
            #expect(watcher.take().last?["model"]?["v"] == 2)
            // While failing, sync writes are refused before they change anything.
            let refused = try c.request(#"{"op":"update","model":{"id":"A","v":3}}"#)
            #expect(refused["error"]?["code"] == "cache_error")
            #expect(try c.request(#"{"op":"get","id":"A"}"#)["model"]?["v"] == 2)
            try FileManager.default.removeItem(atPath: fault)
            try Self.waitFor("the backend to store again") { try c.request(#"{"op":"stats"}"#)["cache"]?["state"] == "ok" }
            let ok = try c.request(#"{"op":"update","model":{"id":"A","v":4}}"#)
            #expect(ok["ok"] == true)
            #expect(ok["durable"] == nil)
            #expect(server.stop() == 0)
        }
        let server = try ServerProcess(arguments: args)
        let c = try server.connect()
        #expect(try c.request(#"{"op":"get","id":"A"}"#)["model"]?["v"] == 4)
        #expect(server.stop() == 0)
    }

    @Test func aBackendThatNeverRecoversMakesShutdownExitNonZeroWithACount() throws {
        let (args, _, fault) = Self.sqliteArgs(["--shutdown-timeout", "1"])
        let server = try ServerProcess(arguments: args)
        let c = try server.connect()
        #expect(FileManager.default.createFile(atPath: fault, contents: nil))
        for i in 0..<20 { try c.request(#"{"op":"update","model":{"id":"E:\#(i)"}}"#) }
        #expect(server.stop() == 3)
        #expect(server.stderr.contains("unstored_records"))
    }
}
