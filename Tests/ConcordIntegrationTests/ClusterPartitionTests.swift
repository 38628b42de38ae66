import ConcordJSON
import ConcordTestServer
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A small network this test creates and removes: one namespace for Redis
/// and one per host, veth pairs on a bridge, addresses 10.231.K.0/24 inside
/// the namespaces only. The hosts' Unix sockets stay reachable from here.
final class TestNetwork: @unchecked Sendable {
    let tag: String
    let subnet: Int
    private(set) var namespaces: [String] = []
    let bridge: String
    let directory: URL
    private var processes: [Process] = []

    /// Root, `ip`, and namespaces that work (a container may forbid them).
    static let available: Bool = {
        guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/sbin/ip"), RedisProcess.available else { return false }
        let probe = "cprobe\(getpid())"
        guard (try? TestNetwork.ip(["netns", "add", probe])) != nil else { return false }
        _ = try? TestNetwork.ip(["netns", "del", probe])
        return true
    }()

    @discardableResult
    static func ip(_ args: [String]) throws -> String {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/sbin/ip")
        p.arguments = args
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else { throw TestFailure("ip \(args.joined(separator: " ")): \(String(decoding: data, as: UTF8.self))") }
        return String(decoding: data, as: UTF8.self)
    }

    init(nodes: [String]) throws {
        tag = String(getpid() % 100_000)
        subnet = 20 + Int(getpid() % 200)
        bridge = "cbr\(tag)"
        directory = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("concord-net-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try Self.ip(["link", "add", bridge, "type", "bridge"])
        try Self.ip(["link", "set", bridge, "up"])
        for (i, n) in nodes.enumerated() {
            let ns = namespace(n)
            try Self.ip(["netns", "add", ns])
            namespaces.append(ns)
            try Self.ip(["link", "add", "v\(n)\(tag)", "type", "veth", "peer", "name", "p\(n)\(tag)"])
            try Self.ip(["link", "set", "p\(n)\(tag)", "netns", ns])
            try Self.ip(["link", "set", "v\(n)\(tag)", "master", bridge])
            try Self.ip(["link", "set", "v\(n)\(tag)", "up"])
            try Self.ip(["netns", "exec", ns, "ip", "addr", "add", "\(address(i))/24", "dev", "p\(n)\(tag)"])
            try Self.ip(["netns", "exec", ns, "ip", "link", "set", "p\(n)\(tag)", "up"])
            try Self.ip(["netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        }
    }

    func namespace(_ node: String) -> String { "c\(node)\(tag)" }
    func address(_ index: Int) -> String { "10.231.\(subnet).\(index + 1)" }

    /// Runs `command` inside the node's namespace; killed (by PID) with the network.
    func spawn(_ node: String, _ command: [String]) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/sbin/ip")
        p.arguments = ["netns", "exec", namespace(node)] + command
        p.standardOutput = FileHandle.nullDevice
        p.standardError = try FileHandle(forWritingTo: log(node))
        try p.run()
        processes.append(p)
        return p
    }

    func log(_ node: String) -> URL {
        let url = directory.appendingPathComponent("\(node).log")
        if !FileManager.default.fileExists(atPath: url.path) { _ = FileManager.default.createFile(atPath: url.path, contents: nil) }
        return url
    }

    /// A silent partition: the node's cable is pulled (packets vanish, nothing fails fast).
    func unplug(_ node: String) throws { try Self.ip(["link", "set", "v\(node)\(tag)", "down"]) }
    func plug(_ node: String) throws { try Self.ip(["link", "set", "v\(node)\(tag)", "up"]) }
    /// A partition that fails at once: the node's route to `address` is prohibited.
    func prohibit(_ node: String, _ address: String) throws {
        try Self.ip(["netns", "exec", namespace(node), "ip", "route", "add", "prohibit", "\(address)/32"])
    }
    func allow(_ node: String, _ address: String) throws {
        try Self.ip(["netns", "exec", namespace(node), "ip", "route", "del", "prohibit", "\(address)/32"])
    }

    deinit {
        for p in processes where p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
        for ns in namespaces { _ = try? Self.ip(["netns", "del", ns]) }
        _ = try? Self.ip(["link", "del", bridge])
        try? FileManager.default.removeItem(at: directory)
    }
}

/// Partitions between hosts and the log over real TCP, each host in its own
/// network namespace (the kernel here has no netem: a pulled link is a
/// silent partition, a prohibit route one that fails at once).
@Suite(.serialized, .enabled(if: TestNetwork.available, "needs root, ip netns and redis-server"))
struct ClusterPartitionTests {
    @Test func aPartitionedHostDetachesServesReadsAndCatchesUpAfterwards() throws {
        let net = try TestNetwork(nodes: ["R", "A", "B"])
        let redisAddress = net.address(0)
        _ = try net.spawn("R", ["/usr/bin/redis-server", "--bind", redisAddress, "--port", "6379", "--save", "", "--appendonly", "no",
                                "--protected-mode", "no", "--dir", net.directory.path])
        var sockets: [String: String] = [:]
        for n in ["A", "B"] {
            let path = net.directory.appendingPathComponent("\(n).sock").path
            sockets[n] = path
            _ = try net.spawn(n, [ConcordTestServer.binary.path, "--socket", path, "--cluster", "redis://\(redisAddress):6379",
                                  "--cluster-name", "p", "--cluster-host", n, "--cluster-timeout", "2"])
        }
        func client(_ n: String) throws -> WireClient {
            var c: WireClient?
            try waitUntil("host \(n) listening") { c = try? WireClient(path: sockets[n]!); return c != nil }
            return c!
        }
        let a = try client("A"), b = try client("B")
        func state(_ c: WireClient) throws -> String? { try c.request(#"{"op":"ping"}"#)["cluster"]?["state"]?.stringValue }
        for c in [a, b] { try waitUntil("attached") { try state(c) == "attached" } }
        #expect(try a.request(#"{"op":"update","model":{"id":"X","v":1}}"#)["seq"] == 1)

        // Silent: A's link is down. A notices within the heartbeat bound; B goes on.
        try net.unplug("A")
        let cut = Date()
        try waitUntil("A detached", timeout: 10) { try state(a) == "detached" }
        #expect(Date().timeIntervalSince(cut) < 3, "detected after \(Date().timeIntervalSince(cut)) s")
        #expect(try a.request(#"{"op":"update","model":{"id":"X","v":2}}"#)["error"]?["code"] == "unavailable")
        #expect(try a.request(#"{"op":"get","id":"X"}"#)["model"]?["v"] == 1)  // reads from its own state
        #expect(try b.request(#"{"op":"update","model":{"id":"X","v":3}}"#)["seq"] == 2)
        try net.plug("A")
        try waitUntil("A attached again", timeout: 15) { try state(a) == "attached" }
        #expect(try a.request(#"{"op":"get","id":"X","min_seq":2}"#)["model"]?["v"] == 3)

        // Fast-failing: A's route to the log is prohibited (connects fail at once).
        try net.prohibit("A", redisAddress)
        try waitUntil("A detached (prohibited)", timeout: 10) { try state(a) == "detached" }
        #expect(try b.request(#"{"op":"update","model":{"id":"X","v":4}}"#)["seq"] == 3)
        try net.allow("A", redisAddress)
        try waitUntil("A attached again", timeout: 15) { try state(a) == "attached" }
        let sa = try a.request(#"{"op":"sync"}"#), sb = try b.request(#"{"op":"sync"}"#)
        #expect(sa["seq"] == 3 && sb["seq"] == 3)
        #expect(try a.request(#"{"op":"get","id":"X"}"#)["model"] == (try b.request(#"{"op":"get","id":"X"}"#)["model"]))
    }
}
