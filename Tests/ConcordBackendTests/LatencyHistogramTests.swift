import CoreMetrics
import Prometheus
import Testing

@testable import ConcordServer

/// The server's own latency histogram writes what swift-prometheus's
/// `Histogram<Duration>` (which it replaced) wrote for the same samples:
/// dashboards and alerts reading `concord_update_event_latency_seconds`
/// see the same buckets, sums and counts.
struct LatencyHistogramTests {
    /// The swift-prometheus histogram's family text for `samples` (nanoseconds).
    static func reference(_ samples: [Int64]) -> String {
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.durationHistogramBuckets[ServerMetrics.latencyLabel] = ServerMetrics.latencyBounds
        let timer = factory.makeTimer(label: ServerMetrics.latencyLabel, dimensions: [])
        for ns in samples { timer.recordNanoseconds(ns) }
        var out: [UInt8] = []
        registry.emit(into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    static func ours(_ samples: [Int64]) -> String {
        let h = LatencyHistogram(name: ServerMetrics.latencyLabel, bounds: ServerMetrics.latencyBounds)
        for ns in samples { h.record(nanoseconds: ns) }
        var out: [UInt8] = []
        h.emit(into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    @Test func writesWhatSwiftPrometheusWrote() {
        // Every bound exactly, one nanosecond either side, zero, whole
        // seconds, and values past the last bound.
        var samples: [Int64] = [0, 1, 999, 1_000_000_000, 2_000_000_000, 7_123_456_789, 60_000_000_000]
        for b in ServerMetrics.latencyBounds.map(LatencyHistogram.nanoseconds) { samples += [b - 1, b, b + 1] }
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<500 { samples.append(Int64.random(in: 0...6_000_000_000, using: &rng)) }
        #expect(Self.ours([]) == Self.reference([]))
        #expect(Self.ours(samples) == Self.reference(samples))
        for s in samples.prefix(60) { #expect(Self.ours([s]) == Self.reference([s]), "sample \(s)") }
    }

    @Test func samplesSinceAReadTimeAreTheirAge() {
        let h = LatencyHistogram(name: "t", bounds: [.milliseconds(1), .milliseconds(10)])
        h.record(since: [10.0, 9.9995, 9.995, 9.9, 10.5], now: 10.0)
        var out: [UInt8] = []
        h.emit(into: &out)
        let text = String(decoding: out, as: UTF8.self)
        // 0 (a read time in the future counts as 0), 0.5 ms, 5 ms, 100 ms, 0.
        #expect(text.contains("t_bucket{le=\"0.001\"} 3\n"), "\(text)")
        #expect(text.contains("t_bucket{le=\"0.01\"} 4\n"), "\(text)")
        #expect(text.contains("t_bucket{le=\"+Inf\"} 5\n"), "\(text)")
        #expect(text.contains("t_count 5\n"), "\(text)")
        #expect(h.count == 5)
    }
}
