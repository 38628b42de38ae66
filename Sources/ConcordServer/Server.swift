import CConcordRuntime
import CLibUV
import ConcordCore
import ConcordJSON
import ConcordProtocol
import ConcordSocket
import CoreMetrics
public import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Why the server could not start. The description is the one line printed before exiting.
public struct StartupError: Error, CustomStringConvertible {
    public let description: String
}

/// `concord-server`: the libuv loop (socket I/O only) in front of the
/// sequencer thread and its workers. See docs/ARCHITECTURE.md.
public final class Server {
    let configuration: ServerConfiguration
    let logger: Logger
    let loop: UnsafeMutablePointer<uv_loop_t>
    var listener: UnsafeMutablePointer<uv_pipe_t>?
    /// The loop's poll of the sequencer's wake-ups (``LoopWakeup``).
    let wakeHandle: UnsafeMutablePointer<uv_poll_t>
    var signalHandles: [UnsafeMutablePointer<uv_signal_t>] = []
    var drainTimer: UnsafeMutablePointer<uv_timer_t>?
    var overflowTimer: UnsafeMutablePointer<uv_timer_t>?
    /// Connections not being read (flow control), to look at again when something drains.
    var stalled = ConnectionMap<Connection>()
    /// Bytes of unfinished lines held by all framers, and who may exceed the budget.
    var unfinishedTotal = 0
    var lineGrant: ConnectionID?
    /// Accepts that failed in the current episode.
    var acceptFailures = 0
    /// Descriptors open before any connection, and the process's limit.
    var fdBaseline = 0
    var fdLimit = Int.max
    var atDescriptorLimit = false
    /// Refused peers by uid: refusals not logged since the episode began (``noteRefusal(_:)``).
    var refusals: [UInt32: (count: Int, since: Double)] = [:]
    let bridge: Bridge
    /// The list `deliveriesArrived` takes deliveries into (kept: no list per hand-off).
    var deliveryScratch: [Sequencer.Delivery] = []
    /// Emptied lists for this thread (reads' frame lists), traded with the sequencer's (``Bridge``).
    var spares = SpareLists()
    var sequencer: Sequencer!
    var metricsEndpoint: MetricsEndpoint?
    /// Cluster mode: the link to the shared log (on this loop).
    var clusterLink: (any ClusterLogLink)?
    /// Cluster mode with a local backend: this host's copy of the state (closed after the loop).
    var clusterLocal: ClusterLocalCopy?
    /// Cluster mode: listening began late (after catching up) and failed.
    var lateStartupFailure: StartupError?

    /// Cluster mode: the core caught up with the log (or stopped following
    /// it, so that operators can see why): now the socket is served.
    func clusterReady() {
        guard listener == nil, !shuttingDown else { return }
        do {
            try listen()
            logger.info("concord-server listening", metadata: [
                "concord.socket": "\(configuration.socketPath)", "concord.cluster": "\(configuration.cluster?.settings.name ?? "")",
            ])
        } catch {
            logger.critical("cannot start: \(error.description)")
            lateStartupFailure = error
            beginShutdown(signal: 0)
        }
    }
    var metrics: ServerMetrics { sequencer.metrics }
    var connections = ConnectionMap<Connection>()
    var nextID = 1
    let readBuffer = UnsafeMutableRawPointer.allocate(byteCount: 1 << 16, alignment: 16)
    var shuttingDown = false
    var drained = false
    var finished = false

    public init(configuration: ServerConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        loop = .allocate(capacity: 1)
        uvMust("uv_loop_init", uv_loop_init(loop))
        wakeHandle = .allocate(capacity: 1)
        bridge = Bridge(wakeup: LoopWakeup())
    }

    deinit {
        // After `run` (every handle closed) or a failed start-up: free what
        // the loop owned, so a leak checker sees nothing at exit.
        // EBUSY here would mean a handle outlived `run`: a leak, not a reason to crash at exit.
        _ = try? uvCall("uv_loop_close", uv_loop_close(loop))
        loop.deallocate()
        wakeHandle.deallocate()
        readBuffer.deallocate()
    }

    /// Binds, serves until SIGINT/SIGTERM, drains, removes the socket. Returns the exit status.
    public func run() throws(StartupError) -> Int32 {
        signal(SIGPIPE, SIG_IGN)
        // A parent may hand us a blocked SIGTERM (spawners often do); we must see it.
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGTERM)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
        uv_loop_set_data(loop, Unmanaged.passUnretained(self).toOpaque())
        guard bridge.wakeup.fd >= 0 else {
            throw StartupError(description: "eventfd: \(String(cString: strerror(bridge.wakeup.openError)))")
        }
        try prepareSocketPath()

        let bridge = self.bridge
        sequencer = Sequencer(configuration: configuration, logger: logger, bridge: bridge)
        if configuration.cache != "none" {
            // dlopen and open() happen here, before the loop runs: never on the loop.
            do {
                let backend = try Backend.open(spec: configuration.cache, configJSON: configuration.cacheConfig, logger: logger)
                try sequencer.attach(backend: backend, configuration: configuration, logger: logger)
            } catch {
                throw StartupError(description: error.description)
            }
        }
        // Cluster mode listens once the host has caught up with the log
        // (``clusterReady()``): a client never sees a host that is far behind.
        if configuration.cluster == nil {
            do {
                try listen()
            } catch {
                // The backend is open and its thread runs: stop it (nothing was written).
                sequencer.abandonStorage()
                throw error
            }
        }
        if let address = configuration.metricsAddress {
            let sequencer = self.sequencer!
            let m = MetricsEndpoint(loop: loop, logger: logger) { token in sequencer.submit(.metrics(token: token)) }
            do {
                try m.listen(address)
            } catch {
                m.close()
                if let l = listener { uv_close(asHandle(l)) { h in h?.deallocate() } }
                listener = nil
                uv_run(loop, UV_RUN_NOWAIT)  // runs the close callbacks; returns a count, not an error
                unlink(configuration.socketPath)
                sequencer.abandonStorage()
                throw error
            }
            metricsEndpoint = m
        }
        if !configuration.allowUIDs.isEmpty || !configuration.allowGIDs.isEmpty, configuration.socketMode & 0o007 == 0 {
            let groupOnly = configuration.socketMode & 0o070 != 0
            if !configuration.allowUIDs.isEmpty || !groupOnly {
                logger.warning("--allow-uid/--allow-gid name other users, but the socket's mode lets only \(groupOnly ? "its group" : "its owner") open it; use --socket-mode 0666 (or 0660 for a group) and a directory they can enter", metadata: [
                    "concord.socket_mode": "\(String(configuration.socketMode, radix: 8))",
                ])
            }
        }

        uvMust("uv_poll_init", uv_poll_init(loop, wakeHandle, bridge.wakeup.fd))
        uv_handle_set_data(asHandle(wakeHandle), Unmanaged.passUnretained(self).toOpaque())
        uvMust("uv_poll_start", uv_poll_start(wakeHandle, Int32(UV_READABLE.rawValue)) { h, _, _ in
            let server = Server.from(h)
            server.bridge.wakeup.consume()
            server.deliveriesArrived()
        })
        for sig in [SIGINT, SIGTERM] {
            let s = UnsafeMutablePointer<uv_signal_t>.allocate(capacity: 1)
            uvMust("uv_signal_init", uv_signal_init(loop, s))
            uv_handle_set_data(asHandle(s), Unmanaged.passUnretained(self).toOpaque())
            uvMust("uv_signal_start", uv_signal_start(s, { h, signum in Server.from(h).beginShutdown(signal: signum) }, sig))
            signalHandles.append(s)
        }
        if let cluster = configuration.cluster {
            guard let endpoint = ClusterLink.Endpoint.parse(cluster.url) else {
                throw StartupError(description: "--cluster \(cluster.url): expected redis://HOST:PORT or unix:///path/to/redis.sock")
            }
            let e = configuration.engine
            let link = ClusterLink(options: ClusterLink.Options(
                endpoint: endpoint, settings: cluster.settings, engineVersion: "concord-\(e.version)/log-2",
                optionsFingerprint: "id_key=\(e.idKey) max_depth=\(e.maxDepth) history_mutations=\(e.historyMutations) history_entities=\(e.historyEntities) token_retention=\(e.tokenRetention) token_memory=\(e.tokenBytes)",
                maxEntryMutations: cluster.entryMutations, snapshotEvery: cluster.snapshotEvery), loop: loop, logger: logger, sequencer: sequencer)
            if let spec = cluster.localCache {
                // Opened and read here, before the loop runs: never on the loop.
                let backend: Backend
                do {
                    backend = try Backend.open(spec: spec, configJSON: cluster.localCacheConfig, logger: logger)
                } catch {
                    throw StartupError(description: error.description)
                }
                let copy = ClusterLocalCopy(backend: backend, cluster: cluster.settings.name, logger: logger)
                link.localCopy = copy.read()
                sequencer.clusterLocal = copy
                clusterLocal = copy
            }
            link.start()
            clusterLink = link
        }
        sequencer.start()
        var rl = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &rl) == 0 && rl.rlim_cur < UInt64(Int32.max) { fdLimit = Int(rl.rlim_cur) }
        fdBaseline = (try? FileManagerLite.countEntries("/proc/self/fd")) ?? 16

        if configuration.cluster != nil {
            logger.info("waiting to catch up with the cluster log before listening", metadata: ["concord.socket": "\(configuration.socketPath)"])
        }
        logger.info(configuration.cluster == nil ? "concord-server listening" : "concord-server started", metadata: [
            "concord.socket": "\(configuration.socketPath)",
            "concord.threads": "\(configuration.threads)",
            "concord.id_key": "\(configuration.engine.idKey)",
            "concord.max_line_bytes": "\(configuration.engine.maxLineBytes)",
            "concord.max_output_bytes": "\(configuration.maxOutputBytes)",
            "concord.output_soft_bytes": "\(configuration.engine.outputSoftBytes)",
            "concord.max_input_bytes": "\(configuration.maxInputBytes)",
            "concord.max_inbox_bytes": "\(configuration.maxInboxBytes)",
            "concord.cache": "\(configuration.cache)",
            "concord.durability": "\(configuration.durability.rawValue)",
            "concord.memory_limit": "\(configuration.memoryLimit)",
            "concord.metrics": "\(configuration.metricsAddress ?? "off")",
        ])
        uv_run(loop, UV_RUN_DEFAULT)  // returns when every handle is closed (Server+Shutdown)
        if let failure = lateStartupFailure {
            _ = sequencer.stopStorage()
            throw failure
        }
        // A second signal must not cut the final store short (SIGKILL still does).
        signal(SIGTERM, SIG_IGN)
        signal(SIGINT, SIG_IGN)
        let unstored = sequencer.stopStorage()
        clusterLocal?.close()
        unlink(configuration.socketPath)
        if unstored > 0 {
            logger.critical("concord-server stopped with records the cache backend did not store", metadata: [
                "concord.socket": "\(configuration.socketPath)", "concord.unstored_records": "\(unstored)",
            ])
            return 3
        }
        logger.info("concord-server stopped", metadata: ["concord.socket": "\(configuration.socketPath)"])
        return 0
    }

    static func from<T>(_ h: UnsafeMutablePointer<T>?) -> Server {
        Unmanaged<Server>.fromOpaque(uv_handle_get_data(asHandle(h!))!).takeUnretainedValue()
    }
}
