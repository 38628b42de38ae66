import CConcordRuntime
import CJemalloc
import ConcordCore
import ConcordJSON

/// jemalloc figures through `mallctl` (jemalloc is the process allocator:
/// linking it replaces malloc for Swift, libuv and everything else).
enum AllocatorStats {
    /// `stats.*` byte counts after refreshing jemalloc's epoch.
    static func snapshot() -> [(String, Int)] {
        _ = CJemalloc_refresh()
        var out: [(String, Int)] = []
        for name in ["allocated", "active", "metadata", "resident", "mapped", "retained"] {
            var v = 0
            if CJemalloc_read_size("stats." + name, &v) == 0 { out.append((name, v)) }
        }
        return out
    }

    static func allocatedBytes() -> Int {
        _ = CJemalloc_refresh()
        var v = 0
        _ = CJemalloc_read_size("stats.allocated", &v)
        return v
    }

    static func json() -> JSON {
        var o = JSONObject()
        o["allocator"] = "jemalloc"
        for (k, v) in snapshot() { o[k] = .int(v) }
        var narenas: UInt32 = 0
        if CJemalloc_read_unsigned("opt.narenas", &narenas) == 0 { o["narenas"] = .int(Int(narenas)) }
        var bg = false
        if CJemalloc_read_bool("background_thread", &bg) == 0 { o["background_thread"] = .bool(bg) }
        o["malloc_conf_builtin"] = .string(String(cString: concord_malloc_conf_in_effect()))
        return .object(o)
    }
}

final class ServerStatsSource: EngineStatsSource {
    let metrics: ServerMetrics
    init(metrics: ServerMetrics) { self.metrics = metrics }
    func prometheusText(_ figures: EngineFigures) -> String {
        String(decoding: exposition(figures), as: UTF8.self)
    }
    /// The registry in Prometheus's text format (`--metrics` scrapes, `stats` with `prometheus`).
    func exposition(_ figures: EngineFigures) -> [UInt8] {
        let p = pool?.policy
        return metrics.exposition(figures, cache: cacheStats(), parallel: (p?.spread ?? 0, p?.keptInline ?? 0, p?.paid ?? 0))
    }
    /// The sequencer's worker pool (its policy is read on the sequencer's
    /// thread, as this is). Strong: the pool lives as long as the server, its
    /// threads never end, and a weak reference's side table was reported by
    /// LeakSanitizer as leaked at exit.
    var pool: WorkerPool?
    /// Set when a cache backend is attached.
    var storage: StorageThread?
    func memoryStats() -> JSON { AllocatorStats.json() }
    func cacheStats() -> JSON { storage?.stats ?? ["backend": "none", "persistent": false] }
}
