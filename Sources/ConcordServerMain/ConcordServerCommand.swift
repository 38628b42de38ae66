import ArgumentParser
import ConcordCore
import ConcordJSON
import ConcordServer
import Logging

#if canImport(Glibc)
import Glibc
#endif

struct ConcordServerCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "concord-server",
        abstract: "A reactive cache server for immutable models, over a Unix socket.",
        discussion: """
            Clients connect to the Unix socket and speak line-delimited JSON \
            (docs/PROTOCOL.md). SIGINT or SIGTERM stops accepting, answers what \
            was already read, flushes, removes the socket file and exits 0.
            """
    )

    /// Every default below is read from here, so the command and the library agree.
    private static let defaults = ServerConfiguration()

    @Option(help: "Unix socket path to listen on (default: $CONCORD_SOCKET, else $XDG_RUNTIME_DIR/concord/concord.sock, else /tmp/concord-<uid>/concord.sock). Its directory must be writable by this user only.")
    var socket: String = Self.defaults.socketPath

    @Option(help: "Threads of the consistency core: the sequencer plus N-1 workers (default: number of cores).")
    var threads: Int = Self.defaults.threads

    @Option(help: "Work items in one step (views to rewrite, lines to parse) from which the core's workers share the work; below it the sequencer works alone.")
    var parallelThreshold: Int = Self.defaults.parallelThreshold

    @Option(help: "Identity member of entities.")
    var idKey: String = Self.defaults.engine.idKey

    @Option(help: "Longest accepted request line in bytes, without its newline; longer lines get too_large.")
    var maxLineBytes: Int = Self.defaults.engine.maxLineBytes

    @Option(help: "Deepest accepted nesting of a request line (the request object is level 1); deeper lines get too_deep.")
    var maxDepth: Int = Self.defaults.engine.maxDepth

    @Option(help: "Live subscriptions allowed per connection; more get limit_exceeded.")
    var maxSubscriptionsPerConnection: Int = Self.defaults.engine.maxSubscriptionsPerConnection

    @Option(help: "Live subscriptions allowed on all connections together; more get limit_exceeded.")
    var maxSubscriptions: Int = Self.defaults.engine.maxSubscriptions

    @Option(help: "Hard limit: unsent output per connection (bytes) beyond which it is disconnected. Only what cannot be coalesced (responses, view-ending events) can reach it.")
    var maxOutputBytes: Int = Self.defaults.maxOutputBytes

    @Option(help: "Soft limit: unsent output per connection (bytes) from which its events are coalesced (PROTOCOL §6.6) and it is not read (default 1 MiB, at most half the hard limit).")
    var outputSoftBytes: Int = Self.defaults.engine.outputSoftBytes

    @Option(help: "Bytes of lines read from one connection and not yet taken by the core above which it is not read.")
    var maxInputBytes: Int = Self.defaults.maxInputBytes

    @Option(help: "Bytes of lines read from all connections and not yet taken by the core (the inbox) above which nothing is read.")
    var maxInboxBytes: Int = Self.defaults.maxInboxBytes

    @Option(help: "Bytes of unfinished lines held for all connections above which only one connection at a time may grow its line.")
    var maxUnfinishedLineBytes: Int = Self.defaults.maxUnfinishedLineBytes

    @Option(help: "Lines the core takes from one connection per round (fairness between connections).")
    var linesPerTurn: Int = Self.defaults.linesPerTurn

    @Option(help: "Milliseconds of work after which the core ends a turn and hands its output to the socket writer.")
    var turnMs: Double = Self.defaults.turnBudget * 1000

    @Option(help: "Sync durability: seconds an acknowledgement waits for a failing backend before it is answered as applied but not durable (\"durable\":false).")
    var syncTimeout: Double = Self.defaults.syncTimeout

    @Option(help: "While the backend fails to store, mutations are refused (cache_error) once this many records wait for it.")
    var maxUnstoredRecords: Int = Self.defaults.maxUnstoredRecords

    @Option(help: "Seconds a shutdown waits for held requests (sync acknowledgements, cache reads) and for a failing backend to store the backlog.")
    var shutdownTimeout: Double = Self.defaults.shutdownTimeout

    @Option(help: "File mode of the socket, in octal.")
    var socketMode: String = "0" + String(Self.defaults.socketMode, radix: 8)

    @Option(help: "Cache backend: memory, sqlite, hash, none (embedded store only), or a path to a backend library.")
    var cache: String = Self.defaults.cache

    @Option(help: "Backend configuration as a JSON object, e.g. '{\"max_bytes\":1000000}'.")
    var cacheConfig: String = Self.defaults.cacheConfig

    @Option(help: "Backend file path (sets \"path\" in the configuration; sqlite default: ./concord.sqlite).")
    var cachePath: String?

    @Option(help: "Backend size bound in bytes (sets \"max_bytes\"; memory default 256 MiB, sqlite 50 MB).")
    var cacheMaxBytes: Int?

    @Option(help: "Backend age limit in seconds (sets \"ttl_ms\"); records older than this read as absent.")
    var cacheTtl: Double?

    @Option(help: "async: acknowledge mutations at once, write behind; sync: acknowledge after the backend stored them.")
    var durability: String = Self.defaults.durability.rawValue

    @Option(help: "Bytes of memory (jemalloc allocated) above which records no view references are evicted from memory and reloaded from the backend on demand; 0: unbounded.")
    var memoryLimit: Int = Self.defaults.memoryLimit

    @Option(help: "Live query definitions (views) the server keeps in all; one more gets limit_exceeded.")
    var maxQueryViews: Int = Self.defaults.engine.maxQueryViews

    @Option(help: "Entities all live query views may hold together (a view holds every match, not only its window); a new view past it gets limit_exceeded.")
    var maxQueryEntities: Int = Self.defaults.engine.maxQueryEntities

    @Option(help: "Mutations the change history keeps: a feed subscribed with since replays from it, deleted names keep their seq that long, and tokens are remembered at least that long.")
    var historyMutations: Int = Self.defaults.engine.historyMutations

    @Option(help: "Entity changes the history holds in all (its memory bound, ~24 B each); past it the oldest mutations leave the history early.")
    var historyEntities: Int = Self.defaults.engine.historyEntities

    @Option(help: "Seconds a mutation's token is remembered at least (and for --history-mutations mutations), within --token-memory.")
    var tokenRetention: Double = Self.defaults.engine.tokenRetention

    @Option(help: "Bytes for remembered tokens (~ token length + 64 B each); past it the oldest are forgotten early.")
    var tokenMemory: Int = Self.defaults.engine.tokenBytes

    @Option(help: "Serve Prometheus metrics over HTTP at HOST:PORT/metrics, e.g. 127.0.0.1:9464 (off by default; keep it on loopback).")
    var metrics: String?  // ServerConfiguration.metricsAddress: nil, off

    @Option(name: .customLong("allow-uid"), help: "A user (uid or name) allowed to connect; repeat for more. With --allow-uid/--allow-gid, every other peer (SO_PEERCRED) gets one forbidden error line and is closed. This server's own user is always allowed. Pair with --socket-mode 0666 (or 0660) so the others can open the socket.")
    var allowUID: [String] = []

    @Option(name: .customLong("allow-gid"), help: "A group (gid or name) whose members' connections are allowed (the peer's primary gid); repeat for more.")
    var allowGID: [String] = []

    @Option(help: "Cluster mode (PROTOCOL §8): the shared log, redis://HOST:PORT or unix:///path/to/redis.sock. Every host applies every mutation in the log's order; reads and subscriptions stay local.")
    var cluster: String?

    @Option(help: "The cluster's name: its log's keys in Redis are concord:{NAME}:… (required with --cluster).")
    var clusterName: String?

    @Option(help: "This host's name in hello, ping and stats (default: the machine's host name).")
    var clusterHost: String?

    @Option(help: "Seconds a mutation waits for the cluster log before it is answered unavailable (with \"indeterminate\":true when it may still be applied).")
    var clusterTimeout: Double = 5

    @Option(help: "Cluster mode: log entries between snapshots of the state (one host at a time writes one; the log is trimmed below the older of the two kept, never by count). 0: no snapshots, the log is never trimmed.")
    var clusterSnapshotEntries: Int = 10_000

    @Option(help: "Cluster mode: mutations per log entry at most (the batching window is one sequencer turn: what the host read meanwhile, up to this many, and up to 1 MiB).")
    var clusterEntryMutations: Int = 256

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "info"

    func validate() throws {
        if threads < 1 || threads > 256 { throw ValidationError("--threads must be between 1 and 256") }
        if idKey.isEmpty { throw ValidationError("--id-key must not be empty") }
        if maxLineBytes < 64 { throw ValidationError("--max-line-bytes must be at least 64") }
        if maxDepth < 2 || maxDepth > 10_000 { throw ValidationError("--max-depth must be between 2 and 10000") }
        if maxSubscriptionsPerConnection < 1 { throw ValidationError("--max-subscriptions-per-connection must be at least 1") }
        if maxSubscriptions < 1 { throw ValidationError("--max-subscriptions must be at least 1") }
        if maxOutputBytes < 4096 { throw ValidationError("--max-output-bytes must be at least 4096") }
        if outputSoftBytes < 1024 { throw ValidationError("--output-soft-bytes must be at least 1024") }
        if maxInputBytes < 1024 { throw ValidationError("--max-input-bytes must be at least 1024") }
        if maxInboxBytes < maxInputBytes { throw ValidationError("--max-inbox-bytes must be at least --max-input-bytes") }
        if maxUnfinishedLineBytes < 0 { throw ValidationError("--max-unfinished-line-bytes must not be negative") }
        if linesPerTurn < 1 { throw ValidationError("--lines-per-turn must be at least 1") }
        if !(turnMs >= 0) { throw ValidationError("--turn-ms must not be negative") }
        if !(syncTimeout >= 0) { throw ValidationError("--sync-timeout must not be negative") }
        if maxUnstoredRecords < 1 { throw ValidationError("--max-unstored-records must be at least 1") }
        if !(shutdownTimeout >= 0) { throw ValidationError("--shutdown-timeout must not be negative") }
        if UInt32(socketMode, radix: 8) == nil { throw ValidationError("--socket-mode must be an octal mode such as 0600") }
        if Durability(rawValue: durability) == nil { throw ValidationError("--durability must be async or sync") }
        if (try? mergedCacheConfig()) == nil { throw ValidationError("--cache-config must be a JSON object") }
        if memoryLimit < 0 { throw ValidationError("--memory-limit must not be negative") }
        if memoryLimit > 0 && cache == "none" { throw ValidationError("--memory-limit needs a cache backend to evict to (not --cache none)") }
        if let t = cacheTtl, t < 0 { throw ValidationError("--cache-ttl must not be negative") }
        if let m = cacheMaxBytes, m < 0 { throw ValidationError("--cache-max-bytes must not be negative") }
        if maxQueryViews < 1 { throw ValidationError("--max-query-views must be at least 1") }
        if maxQueryEntities < 1 { throw ValidationError("--max-query-entities must be at least 1") }
        if historyMutations < 1 { throw ValidationError("--history-mutations must be at least 1") }
        if historyEntities < 1 { throw ValidationError("--history-entities must be at least 1") }
        if tokenRetention < 0 { throw ValidationError("--token-retention must not be negative") }
        if tokenMemory < 0 { throw ValidationError("--token-memory must not be negative") }
        if let m = metrics, MetricsAddress.parse(m) == nil {
            throw ValidationError("--metrics must be HOST:PORT with a numeric address, e.g. 127.0.0.1:9464 or [::1]:9464")
        }
        for u in allowUID where Self.uid(u) == nil { throw ValidationError("--allow-uid: no such user '\(u)'") }
        for g in allowGID where Self.gid(g) == nil { throw ValidationError("--allow-gid: no such group '\(g)'") }
        if let url = cluster {
            guard url.hasPrefix("redis://") || url.hasPrefix("unix:///") else {
                throw ValidationError("--cluster must be redis://HOST:PORT or unix:///path/to/redis.sock")
            }
            guard let name = clusterName, !name.isEmpty, !name.contains("{"), !name.contains("}") else {
                throw ValidationError("--cluster needs --cluster-name NAME (no braces: it becomes the log's Redis hash tag)")
            }
            if cacheMaxBytes != nil || cacheTtl != nil || memoryLimit > 0 {
                throw ValidationError("--cluster: every host must hold the whole state, so --cache-ttl, --cache-max-bytes and --memory-limit (which evict or expire by size and clock) are refused")
            }
            if cachePath != nil && (cache == "memory" || cache == "none") {
                throw ValidationError("--cluster: --cache-path needs a persistent --cache (e.g. sqlite) for the host's local copy of the state")
            }
            if durability != "async" {
                throw ValidationError("--cluster: an acknowledged mutation is as durable as the log (see docs/OPERATIONS.md); --durability sync applies to a local backend only")
            }
            if !(clusterTimeout > 0) { throw ValidationError("--cluster-timeout must be positive") }
            if clusterSnapshotEntries < 0 { throw ValidationError("--cluster-snapshot-entries must not be negative") }
            if clusterEntryMutations < 1 || clusterEntryMutations > 4096 { throw ValidationError("--cluster-entry-mutations must be between 1 and 4096") }
        } else if clusterName != nil || clusterHost != nil {
            throw ValidationError("--cluster-name and --cluster-host need --cluster")
        }
        if Logger.Level(rawValue: logLevel) == nil { throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical") }
    }

    static func hostName() -> String {
        var buf = [CChar](repeating: 0, count: 256)
        guard gethostname(&buf, buf.count - 1) == 0 else { return "host" }
        let bytes = buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// A uid given as a number or a user name.
    static func uid(_ text: String) -> UInt32? {
        if let n = UInt32(text) { return n }
        guard let pw = getpwnam(text) else { return nil }
        return pw.pointee.pw_uid
    }

    /// A gid given as a number or a group name.
    static func gid(_ text: String) -> UInt32? {
        if let n = UInt32(text) { return n }
        guard let gr = getgrnam(text) else { return nil }
        return gr.pointee.gr_gid
    }

    /// `--cache-config` with the convenience options written into it.
    func mergedCacheConfig() throws -> String {
        guard case .object(var o) = try JSONParser(maxDepth: 32).parse(cacheConfig) else {
            throw ValidationError("--cache-config must be a JSON object")
        }
        if let cachePath { o["path"] = .string(cachePath) }
        if let cacheMaxBytes { o["max_bytes"] = .int(cacheMaxBytes) }
        if let cacheTtl { o["ttl_ms"] = .int(Int(cacheTtl * 1000)) }
        return JSON.object(o).compactString
    }

    func run() throws {
        let level = Logger.Level(rawValue: logLevel) ?? .info
        LoggingSystem.bootstrap { label in
            var h = StreamLogHandler.standardError(label: label)
            h.logLevel = level
            return h
        }
        let logger = Logger(label: "concord.server")

        var config = ServerConfiguration()
        config.socketPath = socket
        config.threads = threads
        config.parallelThreshold = max(1, parallelThreshold)
        config.maxOutputBytes = maxOutputBytes
        config.engine.outputSoftBytes = min(outputSoftBytes, maxOutputBytes / 2)
        config.maxInputBytes = maxInputBytes
        config.maxInboxBytes = maxInboxBytes
        config.maxUnfinishedLineBytes = maxUnfinishedLineBytes
        config.linesPerTurn = linesPerTurn
        config.turnBudget = turnMs / 1000
        config.shutdownTimeout = shutdownTimeout
        config.syncTimeout = syncTimeout
        config.maxUnstoredRecords = maxUnstoredRecords
        config.socketMode = UInt32(socketMode, radix: 8) ?? 0o600
        config.engine.idKey = idKey
        config.engine.maxLineBytes = maxLineBytes
        config.engine.maxDepth = maxDepth
        config.engine.maxSubscriptionsPerConnection = maxSubscriptionsPerConnection
        config.engine.maxSubscriptions = maxSubscriptions
        config.engine.maxQueryViews = maxQueryViews
        config.engine.maxQueryEntities = maxQueryEntities
        config.engine.historyMutations = historyMutations
        config.engine.historyEntities = historyEntities
        config.engine.tokenRetention = tokenRetention
        config.engine.tokenBytes = tokenMemory

        config.cache = cluster == nil ? cache : "none"
        config.cacheConfig = try mergedCacheConfig()
        if let url = cluster, let name = clusterName {
            let host = clusterHost ?? Self.hostName()
            var r = SystemRandomNumberGenerator()
            let origin = "\(host)#\(getpid())-\(String(r.next() & 0xffff_ffff, radix: 16))"
            config.cluster = ClusterConfiguration(url: url, settings: ClusterSettings(name: name, host: host, origin: origin, timeout: clusterTimeout))
            config.cluster?.snapshotEvery = clusterSnapshotEntries
            config.cluster?.entryMutations = clusterEntryMutations
            if cache != "memory" && cache != "none" {
                // The host's own copy of the state on disk (resumed from at a restart); the core itself runs as with --cache none.
                config.cluster?.localCache = cache
                config.cluster?.localCacheConfig = config.cacheConfig
            }
        }
        config.durability = Durability(rawValue: durability) ?? .async
        config.memoryLimit = memoryLimit
        config.metricsAddress = metrics
        config.allowUIDs = allowUID.compactMap(Self.uid)
        config.allowGIDs = allowGID.compactMap(Self.gid)

        let server = Server(configuration: config, logger: logger)
        do {
            let status = try server.run()
            if status != 0 { throw ExitCode(status) }
        } catch let e as StartupError {
            logger.critical("cannot start: \(e.description)")
            throw ExitCode(1)
        }
    }
}
