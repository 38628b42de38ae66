// concord-bench: Concord next to Redis pub/sub on this machine's Unix sockets.
//
//   concord-bench [--server PATH] [--redis PATH] [--full] [--out DIR] [--only TEXT]
//
// Writes DIR/latest.json, DIR/chart.svg and prints a table. Every loop is
// bounded in count and time. See README, "Benchmark"; --help for the options.

import ArgumentParser
import Foundation

#if canImport(Glibc)
import Glibc
#endif

signal(SIGPIPE, SIG_IGN)

struct Options: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "concord-bench",
        abstract: "Concord next to Redis pub/sub on this machine's Unix sockets.",
        discussion: """
            Writes OUT/latest.json and OUT/chart.svg and prints a table. Every
            loop is bounded in count and time. Environment:
            CONCORD_BENCH_SERVER_ARGS adds concord-server options (experiments).
            """)

    @Option(help: "The concord-server binary.")
    var server = "../../.build/release/concord-server"

    @Option(help: "The redis-server binary.")
    var redis = "/usr/bin/redis-server"

    @Flag(help: "Longer runs and the 1M-subscription memory scenario.")
    var full = false

    @Option(help: "Where latest.json and chart.svg go.")
    var out = "results"

    @Option(help: "Run only the scenarios whose label contains this text.")
    var only: String?
}

let options = Options.parseOrExit()
let runStart = nowNanos()
let dir = NSTemporaryDirectory() + "concord-bench-\(getpid())"
try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)

nonisolated(unsafe) var step = 0
let totalSteps = 24
/// Announces a scenario; false when `--only` excludes it.
@discardableResult
func progress(_ what: String) -> Bool {
    step += 1
    if let only = options.only, !what.contains(only) { return false }
    FileHandle.standardError.write(Data(String(format: "[%2d/%d %5.0fs] %@\n", step, totalSteps, seconds(since: runStart), what).utf8))
    return true
}

func concord(threads: Int = 2) throws -> (ServerProc, ConcordSystem) {
    let sock = dir + "/concord.sock"
    // CONCORD_BENCH_SERVER_ARGS: extra server options for experiments (space-separated).
    let extra = (ProcessInfo.processInfo.environment["CONCORD_BENCH_SERVER_ARGS"] ?? "").split(separator: " ").map(String.init)
    let p = try ServerProc(options.server, ["--socket", sock, "--cache", "none", "--threads", "\(threads)", "--log-level", "error"] + extra, socket: sock)
    return (p, ConcordSystem(socket: sock))
}

func redis() throws -> (ServerProc, RedisSystem) {
    let sock = dir + "/redis.sock"
    let p = try ServerProc(options.redis, ["--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "",
                                           "--appendonly", "no", "--client-output-buffer-limit", "pubsub 0 0 0",
                                           "--dir", dir], socket: sock)
    return (p, RedisSystem(socket: sock))
}

/// Redis with its default client output buffer limits (the flood scenario: what Redis does by itself).
func redisDefaults() throws -> (ServerProc, RedisSystem) {
    let sock = dir + "/redis.sock"
    let p = try ServerProc(options.redis, ["--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "",
                                           "--appendonly", "no", "--dir", dir], socket: sock)
    return (p, RedisSystem(socket: sock))
}

let d = options.full ? 5.0 : 1.5   // seconds per throughput run
var results: [String: Double] = [:]
var rows: [(String, String, String, String)] = []
var denseSeries: [(subs: Int, concord: Double, redis: Double)] = []
var latencySeries: [(rate: Int, concord: Double, redis: Double)] = []

func fmt(_ v: Double) -> String {
    if v >= 1e6 { return String(format: "%.2fM", v / 1e6) }
    if v >= 1e4 { return String(format: "%.0fk", v / 1e3) }
    return String(format: "%.1f", v)
}

/// Server CPU seconds and events per server CPU-second, Concord beside Redis.
@MainActor func efficiencyRow(_ label: String, _ c: Throughput, _ r: Throughput, key: String) {
    results["\(key)_server_cpu_s"] = c.serverCPUSeconds
    results["redis_\(key)_server_cpu_s"] = r.serverCPUSeconds
    results["\(key)_events_per_cpu_s"] = c.eventsPerCPUSecond
    results["redis_\(key)_events_per_cpu_s"] = r.eventsPerCPUSecond
    rows.append(("\(label) (events per server CPU-s; CPU s)",
                 "\(fmt(c.eventsPerCPUSecond)); \(String(format: "%.2f", c.serverCPUSeconds))",
                 "\(fmt(r.eventsPerCPUSecond)); \(String(format: "%.2f", r.serverCPUSeconds))",
                 String(format: "%.2f", c.eventsPerCPUSecond / max(r.eventsPerCPUSecond, 1))))
}

do {
    // 1. Dense fan-out: S connections all watching the same 100 channels.
    for s in [1, 10, 100] {
        guard progress("dense fan-out, \(s) subscriber connection(s)") else { continue }
        let (cp, c) = try concord()
        try c.prepare(channels: 100, offset: 0)
        let ct = try fanout(c, server: cp, subscribers: s, perConnection: 100, stride: 0, channels: 100, duration: d)
        cp.stop()
        let (rp, r) = try redis()
        let rt = try fanout(r, server: rp, subscribers: s, perConnection: 100, stride: 0, channels: 100, duration: d)
        rp.stop()
        denseSeries.append((s, ct.eventsPerSecond, rt.eventsPerSecond))
        rows.append(("dense fan-out, \(s) subs (events/s)", fmt(ct.eventsPerSecond), fmt(rt.eventsPerSecond),
                     String(format: "%.2f", ct.eventsPerSecond / rt.eventsPerSecond)))
        rows.append(("dense fan-out, \(s) subs (updates/s)", fmt(ct.updatesPerSecond), fmt(rt.updatesPerSecond),
                     String(format: "%.2f", ct.updatesPerSecond / rt.updatesPerSecond)))
        efficiencyRow("dense fan-out, \(s) subs", ct, rt, key: "fanout_dense_\(s)")
        if s == 100 {
            results["fanout_dense_events_per_s"] = ct.eventsPerSecond
            results["redis_fanout_dense_events_per_s"] = rt.eventsPerSecond
            results["fanout_dense_ratio_vs_redis"] = ct.eventsPerSecond / rt.eventsPerSecond
        }
    }
    // Model views: each connection with the same 100 trees (each shared by
    // the 10 connections' subscriptions), then with trees of its own.
    if progress("dense fan-out, 10 connections × 100 model views") {
        for distinct in [false, true] {
            let (cp, c) = try concord()
            try c.prepare(channels: 100, offset: 0)
            let mt = try fanout(c, server: cp, subscribers: 10, perConnection: 100, stride: 0, channels: 100, duration: d, model: true,
                                distinct: distinct)
            cp.stop()
            let tag = distinct ? "_distinct" : ""
            rows.append(("dense fan-out, 10 subs × 100 model views, \(distinct ? "trees of their own" : "equal trees") (events/s; per server CPU-s)",
                         "\(fmt(mt.eventsPerSecond)); \(fmt(mt.eventsPerCPUSecond))", "-", "-"))
            results["fanout_dense_model\(tag)_events_per_s"] = mt.eventsPerSecond
            results["fanout_dense_model\(tag)_events_per_cpu_s"] = mt.eventsPerCPUSecond
        }
    }

    // Pipelined updates on one connection, no subscribers: the per-update cost alone.
    if progress("pipelined updates, one connection, no subscribers") {
        let (cp, c) = try concord()
        try c.prepare(channels: 100, offset: 0)
        let cpu0 = cpuSeconds(cp.pid)
        let (cu, cs) = try runWriters(c, writers: 1, channels: 0..<100, duration: d)
        let ccpu = cpuSeconds(cp.pid) - cpu0
        let cRate = Double(cu) / seconds(since: cs)
        cp.stop()
        let (rp, r) = try redis()
        let rcpu0 = cpuSeconds(rp.pid)
        let (ru, rs) = try runWriters(r, writers: 1, channels: 0..<100, duration: d)
        let rcpu = cpuSeconds(rp.pid) - rcpu0
        let rRate = Double(ru) / seconds(since: rs)
        rp.stop()
        results["pipelined_updates_per_s"] = cRate
        results["redis_pipelined_updates_per_s"] = rRate
        results["pipelined_updates_per_cpu_s"] = ccpu > 0 ? Double(cu) / ccpu : 0
        results["redis_pipelined_updates_per_cpu_s"] = rcpu > 0 ? Double(ru) / rcpu : 0
        rows.append(("pipelined updates, 1 connection (updates/s)", fmt(cRate), fmt(rRate), String(format: "%.2f", cRate / rRate)))
        rows.append(("pipelined updates (per server CPU-s)", fmt(results["pipelined_updates_per_cpu_s"]!),
                     fmt(results["redis_pipelined_updates_per_cpu_s"]!),
                     String(format: "%.2f", results["pipelined_updates_per_cpu_s"]! / max(results["redis_pipelined_updates_per_cpu_s"]!, 1))))
    }

    // 2. Sparse fan-out: 100k channels spread over 100 connections.
    if progress("sparse fan-out, 100k subscriptions over 100 connections") {
        let (cp, c) = try concord()
        try c.prepare(channels: 100_000, offset: 0)
        let ct = try fanout(c, server: cp, subscribers: 100, perConnection: 1000, stride: 1000, channels: 100_000, duration: d)
        cp.stop()
        let (rp, r) = try redis()
        let rt = try fanout(r, server: rp, subscribers: 100, perConnection: 1000, stride: 1000, channels: 100_000, duration: d)
        rp.stop()
        results["fanout_sparse_events_per_s"] = ct.eventsPerSecond
        results["redis_fanout_sparse_events_per_s"] = rt.eventsPerSecond
        results["fanout_sparse_ratio_vs_redis"] = ct.eventsPerSecond / rt.eventsPerSecond
        rows.append(("sparse fan-out, 100k subs (events/s)", fmt(ct.eventsPerSecond), fmt(rt.eventsPerSecond),
                     String(format: "%.2f", ct.eventsPerSecond / rt.eventsPerSecond)))
        efficiencyRow("sparse fan-out, 100k subs", ct, rt, key: "fanout_sparse")
    }

    // 3. Latency at 1k/s and 10k/s with 100k subscriptions.
    for rate in [1000, 10_000] {
        guard progress("latency at \(rate) updates/s, 100k subscriptions") else { continue }
        let (cp, c) = try concord()
        try c.prepare(channels: 100_000, offset: 0)
        let cl = try latency(c, subscribers: 100, perConnection: 1000, rate: Double(rate), duration: options.full ? 10 : 3)
        cp.stop()
        let (rp, r) = try redis()
        let rl = try latency(r, subscribers: 100, perConnection: 1000, rate: Double(rate), duration: options.full ? 10 : 3)
        rp.stop()
        latencySeries.append((rate, cl.p99, rl.p99))
        let label = rate >= 10_000 ? "10k" : "1k"
        results["latency_p50_us_\(label)"] = cl.p50
        results["latency_p99_us_\(label)"] = cl.p99
        results["latency_p999_us_\(label)"] = cl.p999
        results["redis_latency_p50_us_\(label)"] = rl.p50
        results["redis_latency_p99_us_\(label)"] = rl.p99
        results["redis_latency_p999_us_\(label)"] = rl.p999
        rows.append(("latency \(label)/s p50 / p99 / p99.9 (µs)",
                     String(format: "%.0f / %.0f / %.0f", cl.p50, cl.p99, cl.p999),
                     String(format: "%.0f / %.0f / %.0f", rl.p50, rl.p99, rl.p999),
                     String(format: "p99 %.2f", cl.p99 / max(rl.p99, 1))))
    }

    // 3b. Requests that arrive alone, one every 2 ms, each answered before
    // the next: the server's CPU per request, the wake-ups included (the
    // floor of every row whose requests arrive one by one). A ping costs the
    // engine almost nothing; an update of the 227-byte document with no
    // subscriber (Redis: PUBLISH of it to a channel nobody reads).
    if progress("requests arriving alone, one every 2 ms: server CPU per request") {
        let n = options.full ? 5000 : 1500
        let doc = #"{"id":"Doc:1","title":"A document of about two hundred bytes","n":"00000001","author":{"id":"Person:1","name":"Ann"},"tags":["a","b","c"],"body":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#
        let publish = "*3\r\n$7\r\nPUBLISH\r\n$2\r\nch\r\n$\(doc.utf8.count)\r\n\(doc)\r\n"
        for (label, key, concordRequest, redisRequest) in [
            ("ping / PING", "ping", #"{"op":"ping"}"# + "\n", "PING\r\n"),
            ("update, no subscriber / PUBLISH, none", "update", #"{"op":"update","key":"k","model":"# + doc + "}\n", publish),
        ] {
            let (cp, c) = try concord()
            let cu = try aloneCPU(server: cp, socket: c.socket, request: concordRequest, count: n, gap: 0.002)
            cp.stop()
            let (rp, r) = try redis()
            let ru = try aloneCPU(server: rp, socket: r.socket, request: redisRequest, count: n, gap: 0.002)
            rp.stop()
            results["one_by_one_\(key)_cpu_us"] = cu
            results["redis_one_by_one_\(key)_cpu_us"] = ru
            rows.append(("a request alone every 2 ms, \(label) (server CPU µs per request)", String(format: "%.1f", cu),
                         String(format: "%.1f", ru), String(format: "%.2f", cu / max(ru, 0.001))))
        }
    }

    // 4. Memory per subscription.
    for n in options.full ? [100_000, 1_000_000] : [100_000] {
        guard progress("memory, \(n) subscriptions") else { continue }
        let (cp, c) = try concord()
        let cm = try memoryPerSubscription(c, server: cp, count: n)
        cp.stop()
        let (rp, r) = try redis()
        let rm = try memoryPerSubscription(r, server: rp, count: n)
        rp.stop()
        let label = n >= 1_000_000 ? "1M" : "100k"
        results["bytes_per_subscription_\(label)"] = cm.allocatorBytesPerSubscription
        results["rss_bytes_per_subscription_\(label)"] = cm.rssBytesPerSubscription
        results["redis_bytes_per_subscription_\(label)"] = rm.allocatorBytesPerSubscription
        results["redis_rss_bytes_per_subscription_\(label)"] = rm.rssBytesPerSubscription
        results["bytes_per_subscription"] = cm.allocatorBytesPerSubscription
        results["redis_bytes_per_subscription"] = rm.allocatorBytesPerSubscription
        rows.append(("bytes per key subscription, \(label) (allocator / RSS)",
                     String(format: "%.0f / %.0f", cm.allocatorBytesPerSubscription, cm.rssBytesPerSubscription),
                     String(format: "%.0f / %.0f", rm.allocatorBytesPerSubscription, rm.rssBytesPerSubscription),
                     String(format: "%.2f", cm.allocatorBytesPerSubscription / max(rm.allocatorBytesPerSubscription, 1))))
    }

    // 5. Collections churn with 10 subscribers.
    for size in [10_000, 100_000] {
        guard progress("collection churn, \(size) items, 10 subscribers") else { continue }
        let (cp, c) = try concord()
        let ops = try collectionChurn(socket: c.socket, size: size, subscribers: 10, ops: options.full ? 20_000 : (size > 10_000 ? 1500 : 6000))
        cp.stop()
        results["collection_churn_ops_per_s_\(size >= 100_000 ? "100k" : "10k")"] = ops
        rows.append(("collection churn, \(size) items, 10 subs (ops/s)", fmt(ops), "-", "-"))
    }

    // 5b. Live queries (issue 13): 1,000 per-author windows of 20 over 100,000
    // posts, shared by 1k, 10k and 100k subscriptions; 5k updates/s.
    // 0 subscriptions: the same writes with no query at all (the store's own cost);
    // 10k at 1k updates/s: latency when the server is not saturated.
    for (subs, rate) in [(0, 5000.0), (1_000, 5000), (10_000, 5000), (100_000, 5000), (10_000, 1000)] {
        guard progress("live queries, \(subs) subscriptions, 1000 views, 100k posts, \(Int(rate)) updates/s") else { continue }
        let (cp, c) = try concord()
        let q = try queryScenario(server: cp, socket: c.socket, entities: 100_000, authors: 1000, subscriptions: subs,
                                  connections: 100, rate: rate, duration: options.full ? 10 : 3)
        cp.stop()
        var tag = subs >= 100_000 ? "100k" : (subs >= 10_000 ? "10k" : (subs >= 1000 ? "1k" : "0"))
        if rate < 5000 { tag += "_at_\(Int(rate))" }
        results["query_\(tag)_p50_us"] = q.p50
        results["query_\(tag)_p99_us"] = q.p99
        results["query_\(tag)_events_per_s"] = q.eventsPerSecond
        results["query_\(tag)_updates_per_s"] = q.updatesPerSecond
        results["query_\(tag)_cpu_us_per_update"] = q.cpuMicrosPerUpdate
        results["query_\(tag)_bytes_per_view"] = q.bytesPerView
        results["query_\(tag)_bytes_per_subscription"] = q.bytesPerSubscription
        let label = "live queries, \(tag.replacingOccurrences(of: "_at_", with: " subs at ")) \(rate < 5000 ? "/s" : "subs")"
            + " / 1000 views / 100k posts"
        rows.append(("\(label): p50 / p99 (µs)", String(format: "%.0f / %.0f", q.p50, q.p99), "-", "-"))
        rows.append(("\(label): events/s; updates/s", "\(fmt(q.eventsPerSecond)); \(fmt(q.updatesPerSecond))", "-", "-"))
        rows.append(("\(label): server CPU µs per update", String(format: "%.1f", q.cpuMicrosPerUpdate), "-", "-"))
        if subs > 0 {
            rows.append(("\(label): bytes per view; per extra subscription", String(format: "%.0f; %.0f", q.bytesPerView, q.bytesPerSubscription), "-", "-"))
        }
    }

    // Range predicates (`date ≥ a and date < b`, found through the range
    // index): 100 and 1000 views, one subscription each, the same writes at
    // 500 updates/s (1000 authors).
    for views in [100, 1000] {
        guard progress("live queries, \(views) range views, 100k posts, 500 updates/s") else { continue }
        let (cp, c) = try concord()
        let q = try queryScenario(server: cp, socket: c.socket, entities: 100_000, authors: 1000, subscriptions: views,
                                  connections: min(views, 100), rate: 500, duration: options.full ? 10 : 3, indexed: false,
                                  views: views)
        cp.stop()
        results["query_unindexed_\(views)_cpu_us_per_update"] = q.cpuMicrosPerUpdate
        results["query_unindexed_\(views)_p50_us"] = q.p50
        results["query_unindexed_\(views)_p99_us"] = q.p99
        rows.append(("live queries, \(views) range-predicate views (date ranges), 500 updates/s: CPU µs per update; p50 / p99 (µs)",
                     String(format: "%.0f; %.0f / %.0f", q.cpuMicrosPerUpdate, q.p50, q.p99), "-", "-"))
    }

    // 5c. Resuming after a reconnect (§3.2): 10,000 key subscriptions, 1 % changed while away.
    if progress("resume 10,000 key views after a reconnect, 1 % changed: with since vs without") {
        let (cp, c) = try concord()
        let r = try resumeScenario(socket: c.socket, keys: 10_000, changed: 100)
        cp.stop()
        results["resume_10k_bytes_since"] = Double(r.bytesWithSince)
        results["resume_10k_bytes_without"] = Double(r.bytesWithout)
        results["resume_10k_ms_since"] = r.secondsWithSince * 1000
        results["resume_10k_ms_without"] = r.secondsWithout * 1000
        rows.append(("resume 10,000 key views, 1 % changed: bytes read, with since → without",
                     "\(fmt(Double(r.bytesWithSince))) → \(fmt(Double(r.bytesWithout)))", "-",
                     String(format: "×%.1f", Double(r.bytesWithout) / Double(max(1, r.bytesWithSince)))))
        rows.append(("resume 10,000 key views, 1 % changed: ms to the last answer, with since → without",
                     String(format: "%.0f → %.0f", r.secondsWithSince * 1000, r.secondsWithout * 1000), "-", "-"))
    }

    // 6. Scaling: --threads 1 vs 2 on dense fan-out of model views, each
    // connection's trees its own (the work the pool parallelizes).
    var perThreads: [Int: Double] = [:]
    for t in progress("scaling, --threads 1 vs 2") ? [1, 2] : [] {
        let (cp, c) = try concord(threads: t)
        try c.prepare(channels: 100, offset: 0)
        perThreads[t] = try fanout(c, server: cp, subscribers: 100, perConnection: 100, stride: 0, channels: 100, duration: d, model: true,
                                   distinct: true).eventsPerSecond
        cp.stop()
    }
    if !perThreads.isEmpty {
    results["threads_1_events_per_s"] = perThreads[1]
    results["threads_2_events_per_s"] = perThreads[2]
    results["threads_speedup"] = (perThreads[2] ?? 0) / max(perThreads[1] ?? 1, 1)
    rows.append(("model-view fan-out, --threads 1 → 2 (events/s)", "\(fmt(perThreads[1] ?? 0)) → \(fmt(perThreads[2] ?? 0))", "-",
                 String(format: "×%.2f", results["threads_speedup"] ?? 0)))
    }

    // 7. Flood (issue 9): one writer that never reads, 10 readers, one slow reader, one pinger.
    if progress("flood: unbounded writer, 10 readers, 1 slow reader, 1 pinger") {
        let fd = options.full ? 15.0 : 5.0
        let (cp, c) = try concord()
        try c.prepare(channels: 100, offset: 0)
        let cf = try flood(c, server: cp, duration: fd)
        cp.stop()
        let (rp, r) = try redisDefaults()
        let rf = try flood(r, server: rp, duration: fd)
        rp.stop()
        results["flood_peak_rss_bytes"] = Double(cf.peakRSS)
        results["redis_flood_peak_rss_bytes"] = Double(rf.peakRSS)
        results["flood_reader_events_per_s"] = cf.readerEventsPerSecond
        results["redis_flood_reader_events_per_s"] = rf.readerEventsPerSecond
        results["flood_ping_p99_us"] = cf.pingP99us
        results["redis_flood_ping_p99_us"] = rf.pingP99us
        results["flood_slow_reader_dropped"] = cf.slowDropped ? 1 : 0
        results["redis_flood_slow_reader_dropped"] = rf.slowDropped ? 1 : 0
        results["flood_server_cpu_s"] = cf.serverCPUSeconds
        results["redis_flood_server_cpu_s"] = rf.serverCPUSeconds
        rows.append(("flood: peak RSS (MB)", String(format: "%.0f", Double(cf.peakRSS) / 1e6), String(format: "%.0f", Double(rf.peakRSS) / 1e6),
                     String(format: "%.2f", Double(cf.peakRSS) / Double(max(rf.peakRSS, 1)))))
        rows.append(("flood: 10 readers (events/s)", fmt(cf.readerEventsPerSecond), fmt(rf.readerEventsPerSecond),
                     String(format: "%.2f", cf.readerEventsPerSecond / max(rf.readerEventsPerSecond, 1))))
        rows.append(("flood: ping p50 / p99 / max (µs)", String(format: "%.0f / %.0f / %.0f", cf.pingP50us, cf.pingP99us, cf.pingMaxUs),
                     String(format: "%.0f / %.0f / %.0f", rf.pingP50us, rf.pingP99us, rf.pingMaxUs),
                     String(format: "p99 %.2f", cf.pingP99us / max(rf.pingP99us, 1))))
        rows.append(("flood: slow reader (events read, dropped?)", "\(cf.slowEvents), \(cf.slowDropped ? "dropped" : "kept")",
                     "\(rf.slowEvents), \(rf.slowDropped ? "dropped" : "kept")", "-"))
        rows.append(("flood: writer's updates taken / server CPU s", "\(fmt(Double(cf.updatesWritten))) / \(String(format: "%.1f", cf.serverCPUSeconds))",
                     "\(fmt(Double(rf.updatesWritten))) / \(String(format: "%.1f", rf.serverCPUSeconds))", "-"))
    }

    // 8. Cluster mode (issue 21): three hosts and one Redis (AOF), all on these
    // two vCPUs with the load; beside them one server alone with the same load.
    var alone: (l1k: CrossHost, sat: Saturation)?
    for fsync in ["everysec", "always"] {
        guard progress("cluster: 3 hosts + Redis (appendfsync \(fsync)): cross-host latency, saturation") else { continue }
        let ld = options.full ? 10.0 : 3.0
        if alone == nil {
            let (sp, single) = try concord()
            let l = try crossHostLatency(writer: single, watcher: single, rate: 1000, duration: ld)
            let sat = try clusterSaturation(hosts: [(sp, single)], writersPerHost: 6, duration: d, redis: nil)
            sp.stop()
            alone = (l, sat)
            results["alone_1k_event_p50_us"] = l.event.p50
            results["alone_1k_event_p99_us"] = l.event.p99
            results["alone_1k_ack_p50_us"] = l.ack.p50
            results["alone_1k_ack_p99_us"] = l.ack.p99
            results["alone_max_mutations_per_s"] = sat.mutationsPerSecond
            results["alone_cpu_us_per_mutation"] = sat.hostCPUPerMutationUs.first ?? 0
        }
        let name = "bench\(fsync)"
        let rp = try clusterRedis(fsync: fsync)
        let hosts = try clusterHosts(3, log: rp.socket, name: name, snapshotEvery: 10_000)
        defer { for h in hosts { h.0.stop() }; rp.stop() }
        let tag = fsync == "always" ? "cluster_always" : "cluster"
        for rate in fsync == "always" ? [1000.0] : [1000.0, 5000.0] {
            let x = try crossHostLatency(writer: hosts[0].1, watcher: hosts[1].1, rate: rate, duration: ld, redis: (rp, name))
            let r = rate >= 5000 ? "5k" : "1k"
            results["\(tag)_\(r)_event_p50_us"] = x.event.p50
            results["\(tag)_\(r)_event_p99_us"] = x.event.p99
            results["\(tag)_\(r)_ack_p50_us"] = x.ack.p50
            results["\(tag)_\(r)_ack_p99_us"] = x.ack.p99
            results["\(tag)_\(r)_errors"] = Double(x.ack.errors)
            results["\(tag)_\(r)_redis_cpu_us_per_entry"] = x.redisCPUPerEntryUs
            results["\(tag)_\(r)_mutations_per_entry"] = x.mutationsPerEntry
            let a = alone!.l1k
            rows.append(("\(tag) \(r)/s: update → event on another host p50 / p99 (µs)",
                         String(format: "%.0f / %.0f", x.event.p50, x.event.p99), "-",
                         rate == 1000 ? String(format: "alone %.0f / %.0f", a.event.p50, a.event.p99) : "-"))
            rows.append(("\(tag) \(r)/s: writer's update → ok p50 / p99 (µs)",
                         String(format: "%.0f / %.0f", x.ack.p50, x.ack.p99), "-",
                         rate == 1000 ? String(format: "alone %.0f / %.0f", a.ack.p50, a.ack.p99) : "-"))
            rows.append(("\(tag) \(r)/s: Redis CPU µs per log entry; mutations per entry",
                         String(format: "%.1f; %.2f", x.redisCPUPerEntryUs, x.mutationsPerEntry), "-", "-"))
        }
        let sat = try clusterSaturation(hosts: hosts, writersPerHost: 2, duration: d, redis: (rp, name))
        let a = alone!.sat
        results["\(tag)_max_mutations_per_s"] = sat.mutationsPerSecond
        results["\(tag)_max_vs_alone"] = sat.mutationsPerSecond / max(a.mutationsPerSecond, 1)
        results["\(tag)_sat_mutations_per_entry"] = Double(sat.mutations) / Double(max(1, sat.entries))
        results["\(tag)_sat_redis_cpu_us_per_entry"] = sat.redisCPUPerEntryUs
        results["\(tag)_sat_redis_cpu_us_per_mutation"] = sat.redisCPUPerMutationUs
        for (i, c) in sat.hostCPUPerMutationUs.enumerated() { results["\(tag)_sat_host\(i)_cpu_us_per_mutation"] = c }
        rows.append(("\(tag) saturated, 3 hosts × 2 writers: mutations/s",
                     fmt(sat.mutationsPerSecond), "-", String(format: "alone %@ (×%.2f)", fmt(a.mutationsPerSecond), sat.mutationsPerSecond / max(a.mutationsPerSecond, 1))))
        rows.append(("\(tag) saturated: mutations per entry; Redis CPU µs per entry / per mutation",
                     String(format: "%.1f; %.0f / %.2f", Double(sat.mutations) / Double(max(1, sat.entries)), sat.redisCPUPerEntryUs, sat.redisCPUPerMutationUs), "-", "-"))
        rows.append(("\(tag) saturated: CPU µs per mutation, each host",
                     sat.hostCPUPerMutationUs.map { String(format: "%.1f", $0) }.joined(separator: " / "), "-",
                     String(format: "alone %.1f", a.hostCPUPerMutationUs.first ?? 0)))
        if fsync == "everysec" {
            // Its own cluster (one host, a snapshot every 200 entries), so the joiner loads a snapshot and replays the rest.
            for h in hosts { h.0.stop() }
            rp.stop()
            let n = options.full ? 1_000_000 : 100_000
            let every = max(100, n / 140 / 3)  // ~140 mutations per entry when pipelined: about three snapshot points
            let jr = try clusterRedis(fsync: fsync)
            let jh = try clusterHosts(1, log: jr.socket, name: "join", snapshotEvery: every)
            defer { for h in jh { h.0.stop() }; jr.stop() }
            let j = try clusterJoin(hosts: jh, log: jr.socket, name: "join", entities: n, snapshotEvery: every)
            let label = n >= 1_000_000 ? "1M" : "100k"
            results["cluster_join_\(label)_listening_s"] = j.listening
            results["cluster_join_\(label)_synced_s"] = j.synced
            rows.append(("cluster: a host joins with \(label) entities (snapshot + replay): s to listening; to sync",
                         String(format: "%.1f; %.1f", j.listening, j.synced), "-", "-"))
        }
    }
} catch {
    FileHandle.standardError.write(Data("concord-bench: \(error)\n".utf8))
    exit(1)
}

// MARK: Output

results["duration_s"] = seconds(since: runStart)
var json = "{\n"
json += "  \"date\": \"\(ISO8601DateFormatter().string(from: Date()))\",\n"
json += "  \"mode\": \"\(options.full ? "full" : "quick")\",\n"
json += "  \"machine\": \"\(ProcessInfo.processInfo.activeProcessorCount) cores, \(ProcessInfo.processInfo.physicalMemory >> 30) GiB, \(ProcessInfo.processInfo.operatingSystemVersionString.replacingOccurrences(of: "\"", with: ""))\",\n"
let keys = results.keys.sorted()
for (i, k) in keys.enumerated() {
    let v = results[k]!
    json += "  \"\(k)\": \(v.isFinite ? String(format: "%.3f", v) : "null")\(i < keys.count - 1 ? "," : "")\n"
}
json += "}\n"
try? FileManager.default.createDirectory(atPath: options.out, withIntermediateDirectories: true)
try json.write(toFile: options.out + "/latest.json", atomically: true, encoding: .utf8)
try chartSVG(dense: denseSeries, latency: latencySeries).write(toFile: options.out + "/chart.svg", atomically: true, encoding: .utf8)

let w0 = rows.map { $0.0.count }.max() ?? 0
// Cells are never cut: each column is as wide as its widest value.
let w1 = max(16, rows.map { $0.1.count }.max() ?? 0)
let w2 = max(16, rows.map { $0.2.count }.max() ?? 0)
func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }
print(pad("scenario", w0) + "  | " + pad("concord", w1) + " | " + pad("redis", w2) + " | ratio")
print(String(repeating: "-", count: w0 + w1 + w2 + 16))
for (a, b, c, r) in rows {
    print(pad(a, w0) + "  | " + pad(b, w1) + " | " + pad(c, w2) + " | " + r)
}
print(String(format: "\nwrote %@/latest.json and %@/chart.svg in %.0f s", options.out, options.out, seconds(since: runStart)))
try? FileManager.default.removeItem(atPath: dir)
