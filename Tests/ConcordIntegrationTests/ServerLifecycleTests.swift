import ConcordJSON
import ConcordTestServer
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized)
struct ServerLifecycleTests {
    @Test func refusesToStartWhenALiveServerAnswers() throws {
        let server = try ServerProcess()
        let (status, err) = try ServerProcess.runToExit(arguments: ["--socket", server.socketPath])
        #expect(status != 0)
        #expect(err.contains("already listening"))
        // The first server is unharmed.
        #expect(try server.connect().request(#"{"op":"ping"}"#)["ok"] == true)
    }

    @Test func replacesAStaleSocketFile() throws {
        let server = try ServerProcess()
        let path = server.socketPath
        kill(server.process.processIdentifier, SIGKILL)
        server.process.waitUntilExit()
        #expect(FileManager.default.fileExists(atPath: path))
        let p = Process()
        p.executableURL = ServerProcess.binary
        p.arguments = ["--socket", path]
        p.standardError = FileHandle.nullDevice
        try p.run()
        defer { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() }
        var answered = false
        for _ in 0..<200 {
            if let c = try? WireClient(path: path), (try? c.request(#"{"op":"ping"}"#))?["ok"] == true {
                answered = true
                break
            }
            usleep(20_000)
        }
        #expect(answered)
    }

    @Test func refusesAPathThatIsNotASocket() throws {
        let dir = NSTemporaryDirectory() + "concord-notsock-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/file"
        #expect(FileManager.default.createFile(atPath: path, contents: Data("x".utf8)))
        let (status, err) = try ServerProcess.runToExit(arguments: ["--socket", path])
        #expect(status != 0)
        #expect(err.contains("not a socket"))
    }

    @Test func sigtermFlushesRemovesTheSocketAndExitsZero() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        for i in 0..<200 { try c.send(#"{"op":"update","model":{"id":"A","v":\#(i)},"rid":\#(i)}"#) }
        try c.send(#"{"op":"ping","rid":"last"}"#)
        // Wait until the server has read all 201 lines (another connection sees its request count).
        let watcher = try server.connect()
        try waitUntil("the server to read every line") {
            let clients = try watcher.request(#"{"op":"stats","clients":true}"#)["clients"]?.arrayValue ?? []
            return clients.contains { $0["requests"]?.numberValue?.intValue == 201 }
        }
        #expect(server.stop() == 0)
        // Everything sent before the signal was answered and flushed.
        for i in 0..<200 { #expect(try c.response()["rid"] == .int(i)) }
        #expect(try c.response()["seq"] == 200)
        #expect(try c.readLine() == nil)
        #expect(!FileManager.default.fileExists(atPath: server.socketPath))
        #expect(server.stderr.contains("concord-server stopped"))
    }

    @Test func socketModeIsApplied() throws {
        let server = try ServerProcess(arguments: ["--socket-mode", "0640"])
        let attrs = try FileManager.default.attributesOfItem(atPath: server.socketPath)
        #expect((attrs[.posixPermissions] as? Int) == 0o640)
    }

    @Test func helpExplainsTheOptions() throws {
        let (status, _) = try ServerProcess.runToExit(arguments: ["--threads", "0"])
        #expect(status != 0)
        let p = Process()
        p.executableURL = ServerProcess.binary
        p.arguments = ["--help"]
        let pipe = Pipe()
        p.standardOutput = pipe
        try p.run()
        p.waitUntilExit()
        let text = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        for option in ["--socket", "--threads", "--id-key", "--max-line-bytes", "--max-depth",
                       "--max-subscriptions-per-connection", "--max-output-bytes", "--socket-mode", "--log-level"] {
            #expect(text.contains(option), "help lacks \(option)")
        }
    }

    /// A fresh directory of the test's own (mode 0755: only this user writes it).
    static func scratchDirectory(_ name: String) throws -> String {
        let dir = NSTemporaryDirectory() + "concord-\(name)-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    /// A client of a server started by hand, once it listens (5 s at most).
    static func waitForServer(_ socket: String) throws -> WireClient {
        for _ in 0..<250 {
            if let c = try? WireClient(path: socket) { return c }
            usleep(20_000)
        }
        throw TestFailure("no server listened on \(socket)")
    }

    @Test func aSocketInAMissingDirectorySaysSo() throws {
        let (status, err) = try ServerProcess.runToExit(arguments: ["--socket", "/tmp/concord-no-such-dir-\(getpid())/s.sock"])
        #expect(status == 1)
        #expect(err.contains("does not exist"), "\(err)")
    }

    /// The default socket lives in a private per-user directory the server
    /// creates 0700; a directory other users can write is refused.
    @Test func theDefaultSocketIsPrivateAndASharedDirectoryIsRefused() throws {
        let base = try Self.scratchDirectory("xdg")
        defer { try? FileManager.default.removeItem(atPath: base) }
        var env = ProcessInfo.processInfo.environment
        env["CONCORD_SOCKET"] = nil
        env["XDG_RUNTIME_DIR"] = base
        let p = Process()
        p.executableURL = ServerProcess.binary
        p.arguments = ["--cache", "none"]
        p.environment = env
        p.standardError = FileHandle.nullDevice
        try p.run()
        defer { if p.isRunning { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() } }
        let client = try Self.waitForServer(base + "/concord/concord.sock")
        #expect(try client.request(#"{"op":"ping"}"#)["ok"] == true)
        var st = stat()
        #expect(stat(base + "/concord", &st) == 0)
        #expect(st.st_mode & 0o777 == 0o700)
        kill(p.processIdentifier, SIGTERM)
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)

        let shared = base + "/shared"
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        chmod(shared, 0o777)
        let (status, err) = try ServerProcess.runToExit(arguments: ["--socket", shared + "/s.sock"])
        #expect(status == 1)
        #expect(err.contains("writable by other users"), "\(err)")
    }

    /// Out of file descriptors: accept failures are logged once per episode,
    /// the server keeps serving, and accepts again once descriptors are free.
    @Test func runningOutOfDescriptorsIsLoggedOnceAndRecovered() throws {
        let dir = try Self.scratchDirectory("emfile")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let sock = dir + "/s.sock"
        let log = dir + "/err.log"
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/sh")
        p.arguments = ["-c", "ulimit -n 24 && exec \"$0\" --socket \"$1\" --cache none 2>\"$2\"", ServerProcess.binary.path, sock, log]
        try p.run()
        defer { if p.isRunning { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() } }
        let first = try Self.waitForServer(sock)
        #expect(try first.request(#"{"op":"ping"}"#)["ok"] == true)
        var clients: [WireClient] = []
        for _ in 0..<40 { if let c = try? WireClient(path: sock, timeout: 2) { clients.append(c) } }
        // The ones over the limit were accepted and closed at once (EOF), the rest answer.
        var served = 0
        for c in clients where (try? c.request(#"{"op":"ping"}"#))?["ok"] == true { served += 1 }
        #expect(served < 40)
        #expect(try first.request(#"{"op":"ping"}"#)["ok"] == true)
        for c in clients { c.close() }
        clients = []
        // The server accepts again once it has seen the closes.
        try waitUntil("the server to accept again") {
            guard let again = try? WireClient(path: sock, timeout: 2) else { return false }
            return (try? again.request(#"{"op":"ping"}"#))?["ok"] == true
        }
        kill(p.processIdentifier, SIGTERM)
        p.waitUntilExit()
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(text.components(separatedBy: "cannot accept connections").count - 1 == 1, "\(text)")
        #expect(text.contains("accepting connections again"))
    }

    @Test(.disabled(if: Sanitizer.active, Sanitizer.jemallocReason))
    func statsReportsAllocatorFigures() throws {
        let server = try ServerProcess()
        let c = try server.connect()
        try c.request(#"{"op":"subscribe","sub":"a","key":"k"}"#)
        try c.request(#"{"op":"update","key":"k","model":{"id":"A","b":{"id":"B"}}}"#)
        let s = try c.request(#"{"op":"stats"}"#)
        #expect(s["connections"] == 1)
        #expect(s["subscriptions"] == 1)
        #expect(s["entities"] == 2)
        #expect(s["documents"] == 1)
        #expect(s["collections"] == 0)
        #expect(s["memory"]?["allocator"] == "jemalloc")
        #expect((s["memory"]?["resident"]?.numberValue?.intValue ?? 0) > 0)
        #expect(s["cache"]?["backend"] == "memory")
    }
}
