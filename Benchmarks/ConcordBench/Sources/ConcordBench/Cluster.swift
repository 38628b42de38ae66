import Foundation
import Histogram

#if canImport(Glibc)
import Glibc
#endif

// Cluster mode (PROTOCOL §8): three concord-server hosts and one Redis, all
// on this machine's two vCPUs, all over Unix sockets. The figures of issue
// 21: cross-host latency, the writer's update → ok beside one server alone,
// the most mutations/s three hosts accept beside one host, and the CPU each
// process spends per mutation (Redis per log entry too).

/// A Redis holding a cluster log: AOF on, `appendfsync` as given.
func clusterRedis(fsync: String) throws -> ServerProc {
    let sock = dir + "/log.sock"
    let data = dir + "/log-\(fsync)-\(nowNanos())"
    try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
    return try ServerProc(options.redis, ["--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "",
                                          "--appendonly", "yes", "--appendfsync", fsync, "--dir", data], socket: sock)
}

/// `count` hosts of cluster `name` on the Redis at `log`; each is returned once it listens (it binds only when caught up).
func clusterHosts(_ count: Int, log: String, name: String, snapshotEvery: Int) throws -> [(ServerProc, ConcordSystem)] {
    // CONCORD_BENCH_CLUSTER_ARGS: extra options for the hosts (experiments, e.g. --cluster-entry-mutations 64).
    let extra = (ProcessInfo.processInfo.environment["CONCORD_BENCH_CLUSTER_ARGS"] ?? "").split(separator: " ").map(String.init)
    return try (0..<count).map { i in
        let sock = dir + "/h\(i).sock"
        let p = try ServerProc(options.server, ["--socket", sock, "--cluster", "unix://" + log, "--cluster-name", name,
                                                "--cluster-host", "h\(i)", "--cluster-snapshot-entries", "\(snapshotEvery)",
                                                "--threads", "2", "--log-level", "error"] + extra, socket: sock)
        return (p, ConcordSystem(socket: sock))
    }
}

/// One Redis command over its Unix socket; the reply's first line (bulk strings: their value).
func redisCommand(_ socket: String, _ parts: [String]) throws -> String {
    let c = try Conn(socket)
    c.write(resp(parts))
    guard let first = c.readLine() else { throw BenchError("no reply from Redis to \(parts[0])") }
    let line = String(decoding: first.filter { $0 != 13 }, as: UTF8.self)
    if line.hasPrefix("$") { return String(decoding: (c.readLine() ?? []).filter { $0 != 13 }, as: UTF8.self) }
    return String(line.dropFirst())
}

/// The cluster log's offset (entries appended so far).
func logOffset(_ socket: String, name: String) throws -> Int {
    Int(try redisCommand(socket, ["HGET", "concord:{\(name)}:meta", "offset"])) ?? 0
}

/// Waits until the host has applied everything the log held when asked (`sync`).
func syncHost(_ system: ConcordSystem) throws {
    let c = try Conn(system.socket)
    c.write(#"{"op":"sync","timeout_ms":30000}"# + "\n")
    guard let line = c.readLine(), String(decoding: line, as: UTF8.self).contains(#""ok":true"#) else {
        throw BenchError("sync on \(system.socket) failed")
    }
}

struct AckResult {
    var p50 = 0.0, p99 = 0.0
    var acks = 0, errors = 0
}

/// Send times of a paced writer and what its reader found.
final class PacedState: @unchecked Sendable {
    // Sendable: every member is guarded by `lock`.
    let lock = NSLock()
    var sent: [UInt64]
    var result = AckResult()
    init(_ n: Int) { sent = [UInt64](repeating: 0, count: n) }
}

/// A paced writer: `rate` updates/s of the usual payload to keys 0..<keys for
/// `duration` seconds. Its connection holds no subscription, so every line it
/// reads is an answer, in request order: update → answer time per request.
func pacedWriter(_ system: ConcordSystem, keys: Int, rate: Double, duration: Double) throws -> AckResult {
    let c = try Conn(system.socket)
    let total = Int(rate * duration)
    let state = PacedState(total)
    let group = DispatchGroup()
    group.enter()
    Thread {
        c.setTimeout(0.5)
        var h = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
        var got = 0, errors = 0
        let deadline = nowNanos() + UInt64((duration + 15) * 1e9)
        while got < total && nowNanos() < deadline {
            guard let line = c.readLine() else { continue }
            let now = nowNanos()
            let t = state.lock.withLock { state.sent[got] }
            if t > 0 && t <= now { h.record(now - t) }
            if !String(decoding: line.prefix(120), as: UTF8.self).contains(#""ok":true"#) { errors += 1 }
            got += 1
        }
        state.lock.withLock {
            state.result = AckResult(p50: Double(h.valueAtPercentile(50)) / 1000, p99: Double(h.valueAtPercentile(99)) / 1000,
                                     acks: got - errors, errors: errors)
        }
        group.leave()
    }.start()
    var rng = SystemRandomNumberGenerator()
    let start = nowNanos()
    var k = 0
    while k < total && nowNanos() - start < UInt64((duration + 5) * 1e9) {
        let due = min(total, Int(rate * Double(nowNanos() - start) / 1e9))
        if due > k {
            var buf: [UInt8] = []
            for i in k..<due {
                let stamp = nowNanos()
                state.lock.withLock { state.sent[i] = stamp }
                buf += system.publish(Int.random(in: 0..<keys, using: &rng), stamp: stamp, unique: i)
            }
            c.write(buf)
            k = due
        }
        usleep(200)
    }
    group.wait()
    return state.lock.withLock { state.result }
}

struct CrossHost {
    var event: Latency
    var ack: AckResult
    var redisCPUPerEntryUs = 0.0
    var mutationsPerEntry = 0.0
}

/// A paced writer on `writer`; 10 connections × 100 key subscriptions on
/// `watcher` (another host, or the same server alone): update → event there,
/// and the writer's update → ok.
func crossHostLatency(writer: ConcordSystem, watcher: ConcordSystem, rate: Double, duration: Double,
                      redis: (ServerProc, name: String)? = nil) throws -> CrossHost {
    try writer.prepare(channels: 1000, offset: 0)
    try syncHost(watcher)
    let subs = try Subscribers(watcher, connections: 10, perConnection: 100, stride: 100)
    subs.start(watcher, latency: true)
    let cpu0 = redis.map { cpuSeconds($0.0.pid) } ?? 0
    let off0 = try redis.map { try logOffset($0.0.socket, name: $0.name) } ?? 0
    let ack = try pacedWriter(writer, keys: 1000, rate: rate, duration: duration)
    _ = subs.waitFor(ack.acks, timeout: 10)
    subs.finish()
    var r = CrossHost(event: Latency(p50: subs.tally.percentile(50), p99: subs.tally.percentile(99),
                                     p999: subs.tally.percentile(99.9), samples: subs.tally.samples), ack: ack)
    if let redis {
        let entries = try logOffset(redis.0.socket, name: redis.name) - off0
        r.redisCPUPerEntryUs = entries > 0 ? (cpuSeconds(redis.0.pid) - cpu0) / Double(entries) * 1e6 : 0
        r.mutationsPerEntry = entries > 0 ? Double(ack.acks + ack.errors) / Double(entries) : 0
    }
    return r
}

struct Saturation {
    var mutationsPerSecond = 0.0
    var entries = 0
    var mutations = 0
    /// CPU µs per accepted mutation: Redis, then each host.
    var redisCPUPerMutationUs = 0.0
    var redisCPUPerEntryUs = 0.0
    var hostCPUPerMutationUs: [Double] = []
}

/// Pipelined writers (windows of 128) on every host at once for `duration`
/// seconds: the most mutations/s the cluster accepts, and what each process spent.
func clusterSaturation(hosts: [(ServerProc, ConcordSystem)], writersPerHost: Int, duration: Double,
                       redis: (ServerProc, name: String)?) throws -> Saturation {
    let cpu0 = hosts.map { cpuSeconds($0.0.pid) }
    let rcpu0 = redis.map { cpuSeconds($0.0.pid) } ?? 0
    let off0 = try redis.map { try logOffset($0.0.socket, name: $0.name) } ?? 0
    let counts = Tally()
    let start = nowNanos()
    let systems = hosts.map(\.1)
    DispatchQueue.concurrentPerform(iterations: systems.count) { i in
        if let (n, _) = try? runWriters(systems[i], writers: writersPerHost, channels: 0..<1000, duration: duration) {
            counts.add(events: n)
        }
    }
    let elapsed = seconds(since: start)
    for h in hosts { try syncHost(h.1) }
    var s = Saturation()
    s.mutations = counts.total
    s.mutationsPerSecond = Double(counts.total) / elapsed
    s.hostCPUPerMutationUs = hosts.enumerated().map { (i, h) in (cpuSeconds(h.0.pid) - cpu0[i]) / Double(max(1, counts.total)) * 1e6 }
    if let redis {
        s.entries = try logOffset(redis.0.socket, name: redis.name) - off0
        let rcpu = cpuSeconds(redis.0.pid) - rcpu0
        s.redisCPUPerMutationUs = rcpu / Double(max(1, counts.total)) * 1e6
        s.redisCPUPerEntryUs = rcpu / Double(max(1, s.entries)) * 1e6
    }
    return s
}

struct JoinResult {
    var entities = 0
    var listening = 0.0
    var synced = 0.0
    var hostRSS = 0
}

/// `entities` entities (the usual ~200-byte payload) written through host 0,
/// pipelined, then a new host joins: seconds until it listens (it binds
/// once caught up: newest snapshot loaded, the log after it replayed) and
/// until its `sync`.
func clusterJoin(hosts: [(ServerProc, ConcordSystem)], log: String, name: String, entities: Int, snapshotEvery: Int) throws -> JoinResult {
    let c = try Conn(hosts[0].1.socket)
    var i = 0
    while i < entities {
        let n = min(512, entities - i)
        var buf: [UInt8] = []
        for k in i..<(i + n) { buf += hosts[0].1.publish(k, stamp: 0, unique: k) }
        c.write(buf)
        c.skipLines(n)
        i += n
    }
    for h in hosts { try syncHost(h.1) }
    let sock = dir + "/joiner.sock"
    let start = nowNanos()
    let p = try ServerProc(options.server, ["--socket", sock, "--cluster", "unix://" + log, "--cluster-name", name,
                                            "--cluster-host", "joiner", "--cluster-snapshot-entries", "\(snapshotEvery)",
                                            "--threads", "2", "--log-level", "error"], socket: sock, waitSeconds: 120)
    defer { p.stop() }
    var r = JoinResult(entities: entities)
    r.listening = seconds(since: start)
    try syncHost(ConcordSystem(socket: sock))
    r.synced = seconds(since: start)
    r.hostRSS = p.rssBytes
    return r
}
