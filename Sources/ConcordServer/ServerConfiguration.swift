public import ConcordCore
import ConcordSocket
import Logging

/// Everything `concord-server` can be told. Every member has the documented default.
public struct ServerConfiguration: Sendable {
    /// The default socket path (``DefaultSocket``): `$CONCORD_SOCKET`, else
    /// `$XDG_RUNTIME_DIR/concord/concord.sock`, else `/tmp/concord-<uid>/concord.sock`.
    public static var defaultSocketPath: String { DefaultSocket.path }

    /// Unix socket to listen on.
    public var socketPath = ServerConfiguration.defaultSocketPath
    /// File mode of the socket (default 0600: only the owner may connect).
    public var socketMode: UInt32 = 0o600
    /// Threads of the consistency core: the sequencer plus `threads - 1` workers.
    /// Default: the number of cores.
    public var threads = ServerConfiguration.coreCount
    /// Work items (views to rewrite, payloads to encode, lines to parse) below
    /// which a batch runs on the sequencer alone: a hand-off to a worker costs
    /// ~50 µs here. Default 64.
    public var parallelThreshold = 64
    /// Hard limit: unsent output of one connection (after writing what the
    /// socket takes) beyond which it is disconnected. Events are coalesced
    /// from `engine.outputSoftBytes` on, so only what cannot be coalesced
    /// (responses, view-ending events) can reach it. Default 64 MiB.
    public var maxOutputBytes = 64 << 20
    /// Bytes of lines read from one connection and not yet taken by the core
    /// above which the connection is not read. Default 1 MiB.
    public var maxInputBytes = 1 << 20
    /// Bytes of lines read from all connections and not yet taken by the core
    /// (the sequencer's inbox) above which no connection is read. Default 64 MiB.
    public var maxInboxBytes = 64 << 20
    /// Bytes of unfinished lines (read, no newline yet) held for all
    /// connections above which only one connection at a time may grow its
    /// line. Default 64 MiB.
    public var maxUnfinishedLineBytes = 64 << 20
    /// Lines the sequencer takes from one connection per round of a turn. Default 64.
    public var linesPerTurn = 64
    /// Seconds of work after which a turn ends and its output is handed to
    /// the loop (rounds of `linesPerTurn` lines per connection go on until
    /// then). Default 2 ms: a request waits for at most about one turn.
    public var turnBudget = 0.002
    /// Sync durability: seconds an acknowledgement waits for a failing backend
    /// before it is answered as applied but not durable. Default 5.
    public var syncTimeout = 5.0
    /// While the backend fails, mutations are refused once this many records
    /// wait to be stored. Default 100,000.
    public var maxUnstoredRecords = 100_000
    /// Seconds a shutdown waits for held requests (sync acknowledgements,
    /// cache reads) before answering them anyway. Default 10.
    public var shutdownTimeout = 10.0
    /// The cache backend: `memory` (default), `sqlite`, `hash`, a path to a
    /// backend library, or `none` (the embedded store only, no backend).
    public var cache = "memory"
    /// The backend's configuration object (JSON text).
    public var cacheConfig = "{}"
    /// When mutations are acknowledged relative to the backend.
    public var durability = Durability.async
    /// Allocated bytes (jemalloc) above which records no view references are
    /// evicted from memory (they stay in the backend). 0: unbounded.
    public var memoryLimit = 0
    /// `HOST:PORT` to serve Prometheus metrics on over HTTP (`GET /metrics`);
    /// nil: not served (they stay readable with `stats` `"prometheus":true`).
    public var metricsAddress: String?
    /// Peers allowed to connect, by uid and by gid (SO_PEERCRED on accept):
    /// a peer whose uid is in `allowUIDs` or whose gid is in `allowGIDs` is
    /// served; others get one `forbidden` error line and are closed. The
    /// server's own uid is always allowed. Both empty: no check (the socket's
    /// mode and directory decide, as for any Unix socket).
    public var allowUIDs: [UInt32] = []
    public var allowGIDs: [UInt32] = []
    /// Cluster mode (PROTOCOL §8): the log's address and this host's settings; nil: a single server.
    public var cluster: ClusterConfiguration?
    /// Core settings (id key, limits).
    public var engine = EngineConfiguration()

    public init() {}

    public static var coreCount: Int {
        let n = sysconfNProcessors()
        return n > 0 ? n : 1
    }
}

/// `--cluster URL --cluster-name NAME [--cluster-host H] [--cluster-timeout S]`.
public struct ClusterConfiguration: Sendable {
    /// `redis://HOST:PORT` or `unix:///path/to/redis.sock`.
    public var url: String
    public var settings: ClusterSettings
    /// Log entries between snapshots (written by one host at a time; the log
    /// is trimmed below the older of the two kept). 0: none, and no trimming.
    public var snapshotEvery = 10_000
    /// Mutations per log entry at most (`--cluster-entry-mutations`).
    public var entryMutations = 256
    /// A backend (`--cache` name or plugin path) holding this host's own copy
    /// of the state for restarts (ClusterLocalCopy), with its JSON config;
    /// nil: none (a restart loads a snapshot from the log or replays it).
    public var localCache: String?
    public var localCacheConfig = "{}"

    public init(url: String, settings: ClusterSettings) {
        self.url = url
        self.settings = settings
    }
}
