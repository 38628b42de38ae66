import ConcordCore
import ConcordJSON
import ConcordProtocol
import CoreMetrics
import Prometheus
import Synchronization

/// The server's metrics: swift-metrics instruments on a Prometheus registry
/// of its own (never the process-wide `MetricsSystem`, so several servers in
/// one process — tests — keep separate figures).
///
/// Who records what:
/// - the loop thread: bytes written, connections accepted and refused, the
///   update → event latency histogram (one observation per mutation line of
///   a turn, at most ``latencySamplesPerTurn``; see ``Sequencer/Delivery``;
///   a ``LatencyHistogram`` of its own, written after the registry's text);
/// - the core's counters stay plain integers on the sequencer thread (no
///   atomics on the hot path) and are copied into the instruments when
///   someone asks: a scrape of `--metrics`, or `stats` with `"prometheus":true`.
///   Counters advance by the difference since the last copy.
final class ServerMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    private let factory: PrometheusMetricsFactory

    // Loop thread.
    let bytesOut: CoreMetrics.Counter
    let connectionsAccepted: CoreMetrics.Counter
    let connectionsRefused: CoreMetrics.Counter
    let latency: LatencyHistogram

    // Copied from the core's figures.
    private let requests: [CoreMetrics.Counter]
    private let errors: [CoreMetrics.Counter]
    private let responses: CoreMetrics.Counter
    private let events: CoreMetrics.Counter
    private let coalescedEvents: CoreMetrics.Counter
    private let coalescingEpisodes: CoreMetrics.Counter
    private let connections: CoreMetrics.Gauge
    private let connectionsCoalescing: CoreMetrics.Gauge
    private let unsentBytes: CoreMetrics.Gauge
    private let subscriptions: [CoreMetrics.Gauge]
    private let entities: CoreMetrics.Gauge
    private let documents: CoreMetrics.Gauge
    private let collections: CoreMetrics.Gauge
    private let seq: CoreMetrics.Gauge
    private let allocator: [String: CoreMetrics.Gauge]

    private struct Dynamic {
        /// Counter values already added, by metric index (requests, then errors, then the rest).
        var exported: [Int] = []
        /// `concord_cache_<member>` gauges, made on first sight of a backend figure.
        var cache: [String: CoreMetrics.Gauge] = [:]
    }
    private let state = Mutex(Dynamic())
    /// Peers refused by `--allow-uid`/`--allow-gid` (loop thread writes, the
    /// sequencer reads): counted under `concord_errors_total{code="forbidden"}`,
    /// the one error the core never sees.
    let forbidden = Atomic<Int>(0)
    /// Rounds the sequencer gave first to requests from idle connections
    /// (a ping beside a flood), each followed by a delivery: written by the
    /// sequencer, exported as `concord_newcomer_rounds_total`.
    let newcomerRounds = Atomic<Int>(0)
    private let newcomerRoundsCounter: CoreMetrics.Counter
    /// The worker pool's steps: spread or kept inline by its policy, and
    /// the spread ones that paid (`stats.parallel`; WorkerPool, `ParallelPolicy`).
    private let parallelSpread: CoreMetrics.Counter
    private let parallelInline: CoreMetrics.Counter
    private let parallelPaid: CoreMetrics.Counter

    /// Latency observations a turn contributes at most (the oldest lines of the turn first).
    static let latencySamplesPerTurn = 64

    static let latencyLabel = "concord_update_event_latency_seconds"
    static let latencyBounds: [Duration] = [
        .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500),
        .milliseconds(1), .microseconds(2500), .milliseconds(5), .milliseconds(10), .milliseconds(25),
        .milliseconds(50), .milliseconds(100), .milliseconds(250), .seconds(1), .seconds(5),
    ]

    init() {
        let f = PrometheusMetricsFactory(registry: registry)
        factory = f
        bytesOut = Counter(label: "concord_output_bytes_total", factory: f)
        connectionsAccepted = Counter(label: "concord_connections_accepted_total", factory: f)
        connectionsRefused = Counter(label: "concord_connections_refused_total", factory: f)
        latency = LatencyHistogram(name: Self.latencyLabel, bounds: Self.latencyBounds)
        requests = ConcordProtocolNames.operations.map {
            Counter(label: "concord_requests_total", dimensions: [("op", $0)], factory: f)
        }
        errors = ConcordProtocolNames.errorCodes.map {
            Counter(label: "concord_errors_total", dimensions: [("code", $0)], factory: f)
        }
        responses = Counter(label: "concord_responses_total", factory: f)
        events = Counter(label: "concord_events_total", factory: f)
        coalescedEvents = Counter(label: "concord_coalesced_events_total", factory: f)
        coalescingEpisodes = Counter(label: "concord_coalescing_episodes_total", factory: f)
        newcomerRoundsCounter = Counter(label: "concord_newcomer_rounds_total", factory: f)
        parallelSpread = Counter(label: "concord_parallel_steps_total", dimensions: [("how", "spread")], factory: f)
        parallelInline = Counter(label: "concord_parallel_steps_total", dimensions: [("how", "inline")], factory: f)
        parallelPaid = Counter(label: "concord_parallel_steps_paid_total", factory: f)
        connections = CoreMetrics.Gauge(label: "concord_connections", factory: f)
        connectionsCoalescing = CoreMetrics.Gauge(label: "concord_connections_coalescing", factory: f)
        unsentBytes = CoreMetrics.Gauge(label: "concord_unsent_bytes", factory: f)
        subscriptions = Engine.subscriptionKindNames.map {
            CoreMetrics.Gauge(label: "concord_subscriptions", dimensions: [("kind", $0)], factory: f)
        }
        entities = CoreMetrics.Gauge(label: "concord_entities", factory: f)
        documents = CoreMetrics.Gauge(label: "concord_documents", factory: f)
        collections = CoreMetrics.Gauge(label: "concord_collections", factory: f)
        seq = CoreMetrics.Gauge(label: "concord_seq", factory: f)
        var a: [String: CoreMetrics.Gauge] = [:]
        for kind in ["allocated", "active", "metadata", "resident", "mapped", "retained"] {
            a[kind] = CoreMetrics.Gauge(label: "concord_allocator_bytes", dimensions: [("kind", kind)], factory: f)
        }
        allocator = a
    }

    /// Copies the core's figures, the allocator's and the backend's into the
    /// instruments and returns the whole registry in Prometheus's text format
    /// (version 0.0.4).
    /// `parallel`: the worker pool's steps so far (spread, kept inline, paid).
    func exposition(_ figures: EngineFigures, cache: JSON, parallel: (spread: Int, keptInline: Int, paid: Int)) -> [UInt8] {
        let refused = forbidden.load(ordering: .relaxed)
        let errorTotals = figures.errors.map { $0.code == ErrorCode.forbidden.rawValue ? $0.count + refused : $0.count }
        let totals = figures.requests.map(\.count) + errorTotals
            + [figures.responses, figures.events, figures.coalescedEvents, figures.coalescingEpisodes,
               newcomerRounds.load(ordering: .relaxed), parallel.spread, parallel.keptInline, parallel.paid]
        let counters = requests + errors + [responses, events, coalescedEvents, coalescingEpisodes, newcomerRoundsCounter,
                                            parallelSpread, parallelInline, parallelPaid]
        state.withLock { s in
            if s.exported.count != totals.count { s.exported = [Int](repeating: 0, count: totals.count) }
            for i in totals.indices where totals[i] > s.exported[i] {
                counters[i].increment(by: totals[i] - s.exported[i])
                s.exported[i] = totals[i]
            }
            if case .object(let o) = cache {
                for m in o.members {
                    let member = m.key, value = m.value
                    guard let text = value.numberValue?.text, let n = Double(text) else { continue }
                    let gauge = s.cache[member] ?? {
                        let g = CoreMetrics.Gauge(label: "concord_cache_" + Self.metricName(member), factory: factory)
                        s.cache[member] = g
                        return g
                    }()
                    gauge.record(n)
                }
            }
        }
        connections.record(figures.connections)
        connectionsCoalescing.record(figures.connectionsCoalescing)
        unsentBytes.record(figures.unsentBytes)
        for (i, s) in figures.subscriptions.enumerated() where i < subscriptions.count { subscriptions[i].record(s.count) }
        entities.record(figures.entities)
        documents.record(figures.documents)
        collections.record(figures.collections)
        seq.record(figures.seq)
        for (kind, bytes) in AllocatorStats.snapshot() { allocator[kind]?.record(bytes) }
        var out: [UInt8] = []
        out.reserveCapacity(8192)
        registry.emit(into: &out)
        latency.emit(into: &out)
        return out
    }

    /// A backend figure's name as a metric name: `[a-zA-Z0-9_]`, anything else `_`.
    static func metricName(_ s: String) -> String {
        String(decoding: s.utf8.map { c in
            (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) ? c : 0x5F
        }, as: UTF8.self)
    }
}

/// Label values the metrics use: the op names and error codes of the protocol.
enum ConcordProtocolNames {
    static let operations = ConcordProtocol.Operation.metricNames
    static let errorCodes = ConcordProtocol.ErrorCode.all.map(\.rawValue)
}
