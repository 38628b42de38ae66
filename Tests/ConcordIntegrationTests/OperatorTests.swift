import ConcordJSON
import ConcordTestServer
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// What an operator uses: metrics over HTTP and through the CLI, `stats
/// --watch`, and `--allow-uid` / `--allow-gid` refusing other users' processes.
@Suite(.serialized)
struct OperatorTests {
    /// The metrics address the server logged (`--metrics 127.0.0.1:0` binds a free port).
    static func metricsAddress(_ server: ServerProcess) throws -> (host: String, port: UInt16) {
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            let log = server.stderr
            if let r = log.range(of: "concord.metrics=http://") {
                let rest = log[r.upperBound...]
                let hostPort = rest.prefix { $0 != "/" }
                if let colon = hostPort.lastIndex(of: ":"), let port = UInt16(hostPort[hostPort.index(after: colon)...]) {
                    return (String(hostPort[..<colon]), port)
                }
            }
            usleep(20_000)
        }
        throw TestFailure("the server did not log its metrics address: \(server.stderr)")
    }

    /// One HTTP/1.1 exchange over a plain TCP socket: status line, headers, body.
    static func http(_ host: String, _ port: UInt16, _ head: String) throws -> (status: String, headers: String, body: String) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestFailure("socket() failed") }
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        inet_pton(AF_INET, host, &addr.sin_addr)
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { throw TestFailure("cannot connect to \(host):\(port): errno \(errno)") }
        var tv = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let bytes = Array(head.utf8)
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var response: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = recv(fd, &buf, buf.count, 0)
            if n <= 0 { break }
            response.append(contentsOf: buf[..<n])
        }
        let text = String(decoding: response, as: UTF8.self)
        guard let split = text.range(of: "\r\n\r\n") else { throw TestFailure("no HTTP head in: \(text)") }
        let head = String(text[..<split.lowerBound])
        let status = head.split(separator: "\r\n").first.map(String.init) ?? ""
        return (status, head, String(text[split.upperBound...]))
    }

    /// The value of one sample line (`name{labels} value`) in exposition text.
    static func sample(_ text: String, _ series: String) -> Double? {
        for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
            return Double(line.dropFirst(series.count + 1))
        }
        return nil
    }

    @Test func metricsAreScrapedOverHTTP() throws {
        let server = try ServerProcess(arguments: ["--metrics", "127.0.0.1:0"])
        let (host, port) = try Self.metricsAddress(server)
        let sub = try server.connect()
        try sub.request(#"{"op":"subscribe","sub":"s","key":"k"}"#)
        let writer = try server.connect()
        for i in 0..<5 { try writer.request(#"{"op":"update","key":"k","model":{"id":"A","n":\#(i)}}"#) }
        try writer.request(#"{"op":"unsubscribe","sub":"nope"}"#)
        try writer.request(#"{"op":"ping"}"#)   // the subscriber's events are out by now
        _ = try sub.request(#"{"op":"ping"}"#)

        let r = try Self.http(host, port, "GET /metrics HTTP/1.1\r\nHost: concord\r\n\r\n")
        #expect(r.status == "HTTP/1.1 200 OK")
        #expect(r.headers.contains("Content-Type: text/plain; version=0.0.4"))
        let t = r.body
        #expect(Self.sample(t, #"concord_requests_total{op="update"}"#) == 5)
        #expect(Self.sample(t, #"concord_requests_total{op="subscribe"}"#) == 1)
        #expect(Self.sample(t, #"concord_errors_total{code="no_such_sub"}"#) == 1)
        #expect(Self.sample(t, "concord_events_total") == 5)
        #expect(Self.sample(t, "concord_responses_total") == 9)
        #expect(Self.sample(t, "concord_connections") == 2)
        #expect(Self.sample(t, #"concord_subscriptions{kind="key"}"#) == 1)
        #expect(Self.sample(t, "concord_entities") == 1)
        #expect(Self.sample(t, "concord_seq") == 5)
        #expect(Self.sample(t, "concord_connections_accepted_total")! >= 3)  // the start-up probe counts too
        #expect(Self.sample(t, "concord_update_event_latency_seconds_count") == 5)
        #expect((Self.sample(t, "concord_output_bytes_total") ?? 0) > 500)
        #expect(Self.sample(t, "concord_cache_items") != nil)
        if !Sanitizer.active { #expect((Self.sample(t, #"concord_allocator_bytes{kind="allocated"}"#) ?? 0) > 0) }

        // Counters only grow; a second scrape sees the same totals plus what happened since.
        try writer.request(#"{"op":"update","key":"k","model":{"id":"A","n":99}}"#)
        let again = try Self.http(host, port, "GET /metrics HTTP/1.1\r\n\r\n").body
        #expect(Self.sample(again, #"concord_requests_total{op="update"}"#) == 6)

        #expect(try Self.http(host, port, "GET /other HTTP/1.1\r\n\r\n").status == "HTTP/1.1 404 Not Found")
        #expect(try Self.http(host, port, "POST /metrics HTTP/1.1\r\n\r\n").status == "HTTP/1.1 405 Method Not Allowed")
        #expect(try Self.http(host, port, "nonsense\r\n\r\n").status == "HTTP/1.1 400 Bad Request")
        let headOnly = try Self.http(host, port, "HEAD /metrics HTTP/1.1\r\n\r\n")
        #expect(headOnly.status == "HTTP/1.1 200 OK" && headOnly.body.isEmpty)
        // The socket clients were never disturbed.
        #expect(try writer.request(#"{"op":"ping"}"#)["ok"] == true)
        #expect(server.stop() == 0)
    }

    @Test func idleConnectionsCannotKeepAScrapeOut() throws {
        let server = try ServerProcess(arguments: ["--metrics", "127.0.0.1:0"])
        let (host, port) = try Self.metricsAddress(server)
        // More silent connections than the endpoint has slots, kept open.
        var idle: [Int32] = []
        defer { for fd in idle { close(fd) } }
        for _ in 0..<40 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var addr = sockaddr_in()
            addr.sin_family = sa_family_t(AF_INET)
            addr.sin_port = port.bigEndian
            inet_pton(AF_INET, host, &addr.sin_addr)
            let rc = withUnsafePointer(to: &addr) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            #expect(rc == 0)
            idle.append(fd)
        }
        // A scrape still gets its answer: the oldest silent connection made room.
        let r = try Self.http(host, port, "GET /metrics HTTP/1.1\r\n\r\n")
        #expect(r.status == "HTTP/1.1 200 OK")
        #expect(r.body.contains("concord_connections"))
        #expect(server.stop() == 0)
    }

    @Test func aSocketDirectoryOfAnotherUserIsRefused() throws {
        let dir = NSTemporaryDirectory() + "concord-foreign-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        chmod(dir, 0o755)
        // Owned by another user (only root can give it away; elsewhere there is nothing to test).
        guard getuid() == 0, chown(dir, 4242, 4242) == 0 else { return }
        let r = try ServerProcess.runToExit(arguments: ["--socket", dir + "/s.sock"])
        #expect(r.status != 0)
        #expect(r.stderr.contains("belongs to uid 4242"))
    }

    @Test func metricsAddressIsCheckedAtStartUp() throws {
        let dir = NSTemporaryDirectory() + "concord-metrics-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let sock = dir + "/s.sock"
        let bad = try ServerProcess.runToExit(arguments: ["--socket", sock, "--metrics", "nowhere"])
        #expect(bad.status != 0)
        #expect(bad.stderr.contains("--metrics must be HOST:PORT"))
        let notAnAddress = try ServerProcess.runToExit(arguments: ["--socket", sock, "--metrics", "example.org:9464"])
        #expect(notAnAddress.status != 0)
        #expect(notAnAddress.stderr.contains("is not an IPv4 or IPv6 address"))
        // Nothing is left behind: the Unix socket it had bound is removed.
        #expect(!FileManager.default.fileExists(atPath: sock))
    }

    @Test func cliPrintsPrometheusTextAndWatches() throws {
        let server = try ServerProcess()
        let s = server.socketPath
        #expect(try CLITests.concord(["update", #"{"id":"A"}"#, "--key", "k"], socket: s).0 == 0)
        let (status, text, _) = try CLITests.concord(["stats", "--prometheus"], socket: s)
        #expect(status == 0)
        #expect(text.contains("# TYPE concord_requests_total counter"))
        #expect(Self.sample(text, #"concord_requests_total{op="update"}"#) == 1)
        let (watchStatus, watch, _) = try CLITests.concord(["stats", "--watch", "--interval", "0.2", "--count", "3"], socket: s)
        #expect(watchStatus == 0)
        let lines = watch.split(separator: "\n")
        #expect(lines.count == 4)
        #expect(lines.first?.contains("events/s") == true)
        // Third row: rates over 0.2 s, numbers rather than "-".
        #expect(lines.last?.split(separator: " ").count == 11)
        #expect(lines.last?.contains(" - ") == false)
        #expect(try CLITests.concord(["stats", "--watch", "--json"], socket: s).0 != 0)
    }

    /// Runs a tool built next to the server; returns status, stdout, stderr.
    static func tool(_ name: String, _ args: [String]) throws -> (Int32, String, String) {
        let p = Process()
        p.executableURL = ServerProcess.binary.deletingLastPathComponent().appendingPathComponent(name)
        p.arguments = args
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
    }

    @Test func loadToolParsesItsCommandLine() throws {
        let help = try Self.tool("concord-load", ["--help"])
        #expect(help.0 == 0)
        for command in ["codec", "core", "pipeline", "fanout", "subs", "collections", "backend", "populate", "first-get"] {
            #expect(help.1.contains("  \(command) "), "--help does not list \(command)")
        }
        let bogus = try Self.tool("concord-load", ["bogus"])
        #expect(bogus.0 == 64)
        #expect(bogus.2.contains("unknown command 'bogus'"))
        #expect(try Self.tool("concord-load", ["codec", "--nonsense"]).0 == 64)
        let codec = try Self.tool("concord-load", ["codec", "-n", "50"])
        #expect(codec.0 == 0)
        #expect(codec.1.contains("parse:"))
    }

    /// A directory other users can enter and a socket they can open, so only
    /// `--allow-uid`/`--allow-gid` stand between them and the server.
    static func sharedServer(_ extra: [String]) throws -> ServerProcess {
        let dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("concord-shared-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        chmod(dir.path, 0o755)
        return try ServerProcess(arguments: ["--socket-mode", "0666"] + extra, directory: dir)
    }

    /// `ping` from a process running as `uid`/`gid` (setpriv drops root in the
    /// child); python3 is the client, being readable by every user.
    static func pingAs(uid: Int, gid: Int, socket: String) throws -> String {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        let script = """
        import socket, sys
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(sys.argv[1])
        try:
            s.sendall(b'{"op":"ping","rid":1}\\n')
        except OSError:
            pass
        data = b''
        while not data.endswith(b'\\n'):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        print(data.decode().strip())
        """
        p.arguments = ["--reuid", "\(uid)", "--regid", "\(gid)", "--clear-groups", "/usr/bin/python3", "-c", script, socket]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test(.enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")
                   && FileManager.default.isExecutableFile(atPath: "/usr/bin/python3"),
                   "needs root (to act as another user), setpriv and python3"))
    func allowListsRefuseOtherUsers() throws {
        // Only uid 65534 (nobody) besides the server's own user.
        let server = try Self.sharedServer(["--allow-uid", "65534"])
        defer { try? FileManager.default.removeItem(at: server.dir) }
        let allowed = try JSON.parse(Self.pingAs(uid: 65534, gid: 65534, socket: server.socketPath))
        #expect(allowed["ok"] == true)
        let refused = try JSON.parse(Self.pingAs(uid: 4242, gid: 4242, socket: server.socketPath))
        #expect(refused["ok"] == false)
        #expect(refused["error"]?["code"] == "forbidden")
        #expect(refused["error"]?["message"]?.stringValue?.contains("uid 4242") == true)
        // The server's own user is always allowed, and the refusal is logged —
        // once per peer per episode, however often it knocks.
        #expect(try server.connect().request(#"{"op":"ping"}"#)["ok"] == true)
        for _ in 0..<5 { _ = try Self.pingAs(uid: 4242, gid: 4242, socket: server.socketPath) }
        #expect(server.stderr.contains("connection refused: peer not allowed"))
        #expect(server.stderr.contains("concord.peer.uid=4242"))
        #expect(server.stderr.components(separatedBy: "connection refused: peer not allowed").count - 1 == 1)
        // Counted where operators look for errors.
        let prom = try server.connect().request(#"{"op":"stats","prometheus":true}"#)["prometheus"]?.stringValue ?? ""
        #expect(Self.sample(prom, #"concord_errors_total{code="forbidden"}"#) == 6)
        let stats = try server.connect().request(#"{"op":"stats"}"#)
        #expect(stats["connections"] == 1)
        #expect(server.stop() == 0)

        // By group: a peer whose gid is listed.
        let byGroup = try Self.sharedServer(["--allow-gid", "4343"])
        defer { try? FileManager.default.removeItem(at: byGroup.dir) }
        #expect(try JSON.parse(Self.pingAs(uid: 4242, gid: 4343, socket: byGroup.socketPath))["ok"] == true)
        #expect(try JSON.parse(Self.pingAs(uid: 4242, gid: 4242, socket: byGroup.socketPath))["error"]?["code"] == "forbidden")
        // Without lists, the socket's mode alone decides: anyone who can open it is served.
        let open = try Self.sharedServer([])
        defer { try? FileManager.default.removeItem(at: open.dir) }
        #expect(try JSON.parse(Self.pingAs(uid: 4242, gid: 4242, socket: open.socketPath))["ok"] == true)
    }
}

extension OperatorTests {
    /// The worker pool's steps — spread, or kept inline because spreading
    /// had not paid lately — are in `stats.parallel` and in the metrics, and
    /// the two agree. Each update of an entity 20 model views show is one
    /// step of 20 items (over `--parallel-threshold 8`; the trees differ, so
    /// the views are not shared); pings and single lines are no step at all.
    @Test func theWorkerPoolsStepsAreInStatsAndMetrics() throws {
        let server = try ServerProcess(arguments: ["--threads", "2", "--parallel-threshold", "8"])
        let viewer = try server.connect()
        for i in 0..<20 { try viewer.request(#"{"op":"subscribe","sub":"m\#(i)","model":{"viewer":\#(i),"e":{"id":"E:1","v":0}}}"#) }
        let writer = try server.connect()
        for v in 1...50 { #expect(try writer.request(#"{"op":"update","model":{"id":"E:1","v":\#(v)}}"#)["ok"] == true) }
        let r = try writer.request(#"{"op":"stats","prometheus":true}"#)
        let p = r["parallel"]
        #expect(p?["threads"] == 2 && p?["threshold"] == 8)
        func int(_ j: JSON?) -> Int { j?.numberValue?.intValue ?? -1 }
        let spread = int(p?["spread"]), kept = int(p?["kept_inline"]), paid = int(p?["paid"])
        #expect(spread + kept == 50, "steps: \(spread) spread, \(kept) kept inline")
        #expect(spread >= 1 && paid >= 0 && paid <= spread)
        let prom = r["prometheus"]?.stringValue ?? ""
        #expect(Self.sample(prom, #"concord_parallel_steps_total{how="spread"}"#) == Double(spread))
        #expect(Self.sample(prom, #"concord_parallel_steps_total{how="inline"}"#) == Double(kept))
        #expect(Self.sample(prom, "concord_parallel_steps_paid_total") == Double(paid))
        // Whatever the pool did, every view got every update, in order.
        var last = 0
        var events = 0
        viewer.setTimeout(5)
        while events < 20 * 50, let e = try viewer.readJSON() {
            guard e["event"] == "update" else { continue }
            let v = int(e["model"]?["e"]?["v"])
            #expect(v >= last)
            last = v
            events += 1
        }
        #expect(events == 20 * 50 && last == 50)
        #expect(server.stop() == 0)
    }
}

extension JSON {
    static func parse(_ text: String) throws -> JSON { try JSONParser().parse(text) }
}
