import ConcordJSON
import ConcordTestServer
import ConcordTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Cache backends through the real server: restart, kill -9, bounds, bad plugins.
@Suite(.serialized)
struct PersistenceTests {
    static func tempPath(_ name: String) -> String {
        TestDirectories.make("concord-p") + "/" + name
    }

    @Test func restartServesTheSameDocumentWithCurrentEntities() throws {
        let db = Self.tempPath("c.sqlite")
        let args = ["--cache", "sqlite", "--cache-path", db]
        do {
            let server = try ServerProcess(arguments: args)
            let c = try server.connect()
            try c.request(#"{"op":"schema","required":{"Msg":["from"]}}"#)
            try c.request(#"{"op":"update","key":"inbox","model":{"title":"Inbox","items":[{"id":"Msg:1","from":{"id":"U:1","n":"ann"}},{"id":"Msg:2","from":{"id":"U:2","n":"bob"}}]}}"#)
            try c.request(#"{"op":"update","model":{"id":"U:1","n":"ann (edited)"}}"#)
            try c.request(#"{"op":"collection.set","collection":"people","items":[{"id":"U:2","n":"bob"},{"id":"U:1","n":"ann (edited)"}]}"#)
            #expect(try c.request(#"{"op":"ping"}"#)["seq"] == 3)
            #expect(server.stop() == 0)
        }
        let server = try ServerProcess(arguments: args)
        let c = try server.connect()
        let r = try c.request(#"{"op":"subscribe","sub":"k","key":"inbox"}"#)
        #expect(r["model"] == (try JSONParser().parse(#"{"title":"Inbox","items":[{"id":"Msg:1","from":{"id":"U:1","n":"ann (edited)"}},{"id":"Msg:2","from":{"id":"U:2","n":"bob"}}]}"#)))
        #expect(r["seq"] == 3)
        #expect(try c.request(#"{"op":"get","collection":"people"}"#)["items"]?.arrayValue?.count == 2)
        #expect(try c.request(#"{"op":"schema"}"#)["required"] == ["Msg": ["from"]])
        // The loaded document is live: the schema cascade and the subscription work on it.
        let d = try c.request(#"{"op":"delete","id":"U:2"}"#)
        #expect(d["seq"] == 4)
        let ev = c.take()
        #expect(ev.first?["model"]?["items"]?.arrayValue?.count == 1)
        #expect(try c.request(#"{"op":"get","collection":"people"}"#)["items"]?.arrayValue?.count == 1)
    }

    /// A query over a type sees every entity the backend holds, not only the
    /// resident ones: after a restart (nothing in memory) and with records
    /// evicted under --memory-limit. Every backend lists by prefix (`scan`).
    /// A token outlives the process (PROTOCOL §4.1): a retry after a restart
    /// gets the original answer; a conditional write compares with the
    /// records read back, whose last change is stored with them.
    @Test func tokensAndConditionsAcrossARestart() throws {
        let db = Self.tempPath("t.sqlite")
        let args = ["--cache", "sqlite", "--cache-path", db, "--durability", "sync"]
        do {
            let server = try ServerProcess(arguments: args)
            let c = try server.connect()
            #expect(try c.request(#"{"op":"update","model":{"id":"A:1","n":1}}"#)["seq"] == 1)
            #expect(try c.request(#"{"op":"collection.insert","collection":"c","token":"once","items":[{"id":"I:1"}]}"#)["seq"] == 2)
            #expect(server.stop() == 0)
        }
        let server = try ServerProcess(arguments: args)
        let c = try server.connect()
        let retry = try c.request(#"{"op":"collection.insert","collection":"c","token":"once","items":[{"id":"I:1"}]}"#)
        #expect(retry["seq"] == 2)
        #expect(retry["duplicate"] == true)
        #expect(try c.request(#"{"op":"get","collection":"c"}"#)["items"]?.arrayValue?.count == 1)
        // A:1 is on disk, not in memory, last changed at seq 1: "never written" (0) conflicts, 1 does not.
        let r = try c.request(#"{"op":"update","if_unchanged_since":0,"model":{"id":"A:1","n":2}}"#)
        #expect(r["error"]?["code"] == "conflict")
        #expect(r["error"]?["seq"] == 1)
        #expect(try c.request(#"{"op":"update","if_unchanged_since":1,"model":{"id":"A:1","n":2}}"#)["seq"] == 3)
        // A view resumed across the restart: unchanged since it was read.
        #expect(try c.request(#"{"op":"subscribe","sub":"c","collection":"c","since":2}"#)["unchanged"] == true)
        #expect(try c.request(#"{"op":"update","if_unchanged_since":0,"model":{"id":"New:1"}}"#)["seq"] == 4)
        #expect(server.stop() == 0)
    }

    @Test(arguments: ["sqlite", "memory-limit"])
    func queriesSeeEntitiesOnlyTheBackendHolds(mode: String) throws {
        let db = Self.tempPath("q.sqlite")
        var args = ["--cache", "sqlite", "--cache-path", db, "--cache-max-bytes", "0"]
        if mode == "memory-limit" { args += ["--memory-limit", "1"] }
        let ids = (0..<300).map { "Post:\($0)" }
        do {
            let server = try ServerProcess(arguments: args)
            let c = try server.connect()
            for (i, id) in ids.enumerated() {
                try c.request(#"{"op":"update","model":{"id":"\#(id)","date":\#(i),"by":{"id":"Person:\#(i % 3)","name":"P\#(i % 3)"}}}"#)
            }
            try c.request(#"{"op":"update","model":{"id":"Other:1","date":1}}"#)
            if mode == "memory-limit" {
                // Everything stored is evicted from memory at the next turns.
                var entities = Int.max
                for _ in 0..<200 where entities > 10 {
                    entities = try c.request(#"{"op":"stats"}"#)["entities"]?.numberValue?.intValue ?? 0
                    usleep(20_000)
                }
                #expect(entities <= 10)
                let r = try c.request(#"{"op":"subscribe","sub":"q","query":{"type":"Post","where":{"path":"by.id","eq":"Person:1"},"order":[{"path":"date","desc":true}],"limit":3}}"#)
                #expect(r["count"] == 100)
                #expect(r["items"]?.arrayValue?.map { $0["id"] } == ["Post:298", "Post:295", "Post:292"])
                #expect(r["items"]?.arrayValue?.first?["by"]?["name"] == "P1")
                // Live afterwards: a write moves the window.
                try c.request(#"{"op":"update","model":{"id":"Post:1","date":1000,"by":{"id":"Person:1","name":"P1"}}}"#)
                #expect(c.take().first?["changes"]?.arrayValue?.count == 2)
                return
            }
            #expect(server.stop() == 0)
        }
        let server = try ServerProcess(arguments: args)
        let c = try server.connect()
        #expect(try c.request(#"{"op":"stats"}"#)["entities"] == 0)
        let r = try c.request(#"{"op":"subscribe","sub":"q","query":{"type":"Post","order":[{"path":"date"}],"offset":10,"limit":2}}"#)
        #expect(r["count"] == 300)
        #expect(r["items"]?.arrayValue?.map { $0["id"] } == ["Post:10", "Post:11"])
        #expect(r["items"]?.arrayValue?.first?["by"] == ["id": "Person:1", "name": "P1"])
        let g = try c.request(#"{"op":"get","query":{"type":"Post","where":{"path":"by.name","eq":"P2"}}}"#)
        #expect(g["count"] == 100)
        // Other types are not loaded by it.
        #expect(try c.request(#"{"op":"stats"}"#)["entities"] == 303)
    }

    @Test func killNineInSyncModeLosesNoAcknowledgedWrite() throws {
        let db = Self.tempPath("c.sqlite")
        let args = ["--cache", "sqlite", "--cache-path", db, "--durability", "sync"]
        var acked: [Int: Int] = [:]
        do {
            let server = try ServerProcess(arguments: args)
            let c = try server.connect()
            // Pipeline writes, read some acknowledgements, then kill mid-stream.
            for i in 0..<400 { try c.send(#"{"op":"update","model":{"id":"E:\#(i % 50)","v":\#(i)},"rid":\#(i)}"#) }
            for _ in 0..<150 {
                let r = try c.response()
                guard let rid = r["rid"]?.numberValue?.intValue, r["ok"] == true else { continue }
                acked[rid % 50] = max(acked[rid % 50] ?? -1, rid)
            }
            kill(server.process.processIdentifier, SIGKILL)
            server.process.waitUntilExit()
        }
        #expect(acked.count == 50)
        let server = try ServerProcess(arguments: args)
        let c = try server.connect()
        for (e, v) in acked {
            let got = try c.request(#"{"op":"get","id":"E:\#(e)"}"#)["model"]?["v"]?.numberValue?.intValue ?? -1
            #expect(got >= v, "E:\(e) acknowledged at \(v), after restart \(got)")
        }
    }

    @Test func backendByteBoundHoldsUnderAWriteStorm() throws {
        let server = try ServerProcess(arguments: ["--cache", "memory", "--cache-max-bytes", "200000"])
        let c = try server.connect()
        let blob = String(repeating: "x", count: 900)
        var batch = ""
        for i in 0..<3000 {
            batch += #"{"op":"update","model":{"id":"S:\#(i)","blob":"\#(blob)"}}"# + "\n"
        }
        try c.write(batch)
        for _ in 0..<3000 { _ = try c.response() }
        _ = try c.request(#"{"op":"ping"}"#)
        // The backend stores behind the core: wait until it has evicted down to its bound.
        try waitUntil("the memory backend to evict to its bound") {
            (try c.request(#"{"op":"stats"}"#)["cache"]?["bytes"]?.numberValue?.intValue ?? .max) <= 200_000
        }
        let cache = try c.request(#"{"op":"stats"}"#)["cache"]!
        #expect(cache["backend"] == "memory")
        #expect((cache["bytes"]?.numberValue?.intValue ?? .max) <= 200_000)
        #expect((cache["evictions"]?.numberValue?.intValue ?? 0) > 0)
    }

    @Test(.disabled(if: Sanitizer.active, Sanitizer.jemallocReason))
    func memoryLimitEvictsUnwatchedRecordsAndReadsThemBack() throws {
        let db = Self.tempPath("c.sqlite")
        let server = try ServerProcess(arguments: ["--cache", "sqlite", "--cache-path", db, "--cache-max-bytes", "0",
                                                   "--memory-limit", "24000000"])
        let c = try server.connect()
        try c.request(#"{"op":"subscribe","sub":"watched","ids":["W:1"]}"#)
        try c.request(#"{"op":"update","model":{"id":"W:1","v":1}}"#)
        let blob = String(repeating: "z", count: 2000)
        for round in 0..<10 {
            var batch = ""
            for i in 0..<2000 {
                let n = round * 2000 + i
                batch += #"{"op":"update","model":{"id":"B:\#(n)","n":\#(n),"blob":"\#(blob)"}}"# + "\n"
            }
            try c.write(batch)
            for _ in 0..<2000 { _ = try c.response() }
        }
        _ = try c.request(#"{"op":"ping"}"#)
        // Records become evictable once the backend stored them (write-behind): wait for that.
        try? waitUntil("records to be evicted", timeout: 10) {
            (try c.request(#"{"op":"stats"}"#)["entities"]?.numberValue?.intValue ?? .max) < 20_001
        }
        let stats = try c.request(#"{"op":"stats"}"#)
        let resident = stats["entities"]?.numberValue?.intValue ?? .max
        #expect(resident < 20_001, "nothing was evicted: \(resident) entities resident")
        // Evicted records read through from the backend; watched ones stayed.
        #expect(try c.request(#"{"op":"get","id":"B:7"}"#)["model"]?["n"] == 7)
        #expect(try c.request(#"{"op":"get","id":"B:19999"}"#)["model"]?["n"] == 19999)
        #expect(try c.request(#"{"op":"get","id":"W:1"}"#)["model"]?["v"] == 1)
    }

    @Test func aCorruptSQLiteFileStillLetsTheServerStart() throws {
        let db = Self.tempPath("c.sqlite")
        #expect(FileManager.default.createFile(atPath: db, contents: Data(repeating: 0x42, count: 16384)))
        let server = try ServerProcess(arguments: ["--cache", "sqlite", "--cache-path", db])
        let c = try server.connect()
        try c.request(#"{"op":"update","model":{"id":"A","v":1}}"#)
        #expect(try c.request(#"{"op":"get","id":"A"}"#)["model"]?["v"] == 1)
        #expect(server.stderr.contains("moved it to"))
    }

    @Test func unreadableRecordsAreMisses() throws {
        // A record written by a "future" format reads as absent; the server keeps going.
        let db = Self.tempPath("c.sqlite")
        do {
            let server = try ServerProcess(arguments: ["--cache", "sqlite", "--cache-path", db])
            let c = try server.connect()
            try c.request(#"{"op":"update","model":{"id":"A","v":1}}"#)
            #expect(server.stop() == 0)
        }
        let sqlite = Process()
        sqlite.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        sqlite.arguments = ["python3", "-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(\"update records set value=x'7b2276223a39397d'\"); c.commit()", db]
        try sqlite.run()
        sqlite.waitUntilExit()
        let server = try ServerProcess(arguments: ["--cache", "sqlite", "--cache-path", db])
        let c = try server.connect()
        #expect(try c.request(#"{"op":"get","id":"A"}"#)["model"] == .null)
        #expect(try c.request(#"{"op":"get","id":"A"}"#)["model"] == .null)
        let logs = server.stderr.components(separatedBy: "unreadable cache record").count - 1
        #expect(logs == 1)
    }

    @Test func badPluginsStopStartUpWithOneClearLine() throws {
        let dir = Self.tempPath("x")
        let sock = dir + ".sock"
        let cases: [([String], String)] = [
            (["--cache", "/nonexistent/libnope.so"], "no such file"),
            (["--cache", try CLibrary.build("int nothing_here(void) { return 0; }")], "concord_backend_entry"),
            (["--cache", try CLibrary.build(CLibrary.wrongVersion)], "ABI version 7"),
            (["--cache", "sqlite", "--cache-path", "/nonexistent-dir/a/b.sqlite"], "open failed"),
            (["--cache-config", "[1]"], "--cache-config"),
        ]
        for (args, needle) in cases {
            let (status, err) = try ServerProcess.runToExit(arguments: ["--socket", sock] + args)
            #expect(status != 0, "\(args)")
            #expect(err.contains(needle), "\(args): \(err)")
            #expect(!err.contains("Fatal error") && !err.contains("crashed"), "\(args): \(err)")
            #expect(!FileManager.default.fileExists(atPath: sock))
        }
    }
}

/// Tiny C libraries built with gcc for the loader's failure cases.
enum CLibrary {
    static func build(_ source: String) throws -> String {
        let base = PersistenceTests.tempPath("lib")
        try source.write(toFile: base + ".c", atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/gcc")
        p.arguments = ["-shared", "-fPIC", "-o", base + ".so", base + ".c"]
        try p.run()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else { throw TestFailure("gcc failed") }
        return base + ".so"
    }

    static let wrongVersion = """
        #include <stdint.h>
        struct api { uint32_t abi_version; uint32_t struct_size; const char *name; void *fns[9]; };
        static struct api t = { 7, sizeof(struct api), "old", {0} };
        const struct api *concord_backend_entry(void) { return &t; }
        """
}
