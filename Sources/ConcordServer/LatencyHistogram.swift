import Synchronization

/// The update → event latency histogram (`concord_update_event_latency_seconds`),
/// kept in integer nanoseconds and written in Prometheus's text format as
/// swift-prometheus writes its own histograms (same bucket bounds, same
/// number spelling: `LatencyHistogramTests` compares the two).
///
/// Why not swift-prometheus's `Histogram<Duration>` behind a swift-metrics
/// `Timer`: an observation there compares the value with every bound as a
/// 128-bit `Duration` and adds it to a `Duration` sum, ~700 instructions, one
/// per update a client sends and waits for (a sixtieth of the whole server's
/// cost of such an update). Here the loop thread records a delivery's
/// samples under one lock: a bucket found by comparing integers, a count
/// and a sum added.
///
/// Written by the loop thread, read by whoever renders the metrics (the
/// sequencer, for a scrape or `stats`); the lock is uncontended but for
/// those reads.
final class LatencyHistogram: Sendable {
    let name: String
    /// Upper bounds in nanoseconds, ascending; the last bucket (`+Inf`) is implicit.
    let bounds: [Int64]

    private struct State {
        /// Observations per bucket (not cumulative; `bounds.count + 1` of them).
        var counts: [Int]
        var sum: Int64 = 0
        var count = 0

        /// Counts `ns` in the first bucket whose bound is at least `ns` (as
        /// swift-prometheus does: a value on a bound is in that bound's bucket).
        @inline(__always)
        mutating func add(_ ns: Int64, _ bounds: [Int64]) {
            var b = 0
            while b < bounds.count && bounds[b] < ns { b += 1 }
            counts[b] += 1
            sum &+= ns
            count += 1
        }
    }
    private let state: Mutex<State>

    init(name: String, bounds: [Duration]) {
        self.name = name
        self.bounds = bounds.map { Self.nanoseconds($0) }
        precondition(zip(self.bounds, self.bounds.dropFirst()).allSatisfy { $0 < $1 }, "bounds must ascend")
        state = Mutex(State(counts: [Int](repeating: 0, count: bounds.count + 1)))
    }

    static func nanoseconds(_ d: Duration) -> Int64 {
        let (s, atto) = d.components
        return s * 1_000_000_000 + atto / 1_000_000_000
    }

    /// Records each sample, `now - t` (seconds, from ``monotonicSeconds()``; a negative one counts as 0).
    func record(since samples: [Double], now: Double) {
        let bounds = self.bounds
        state.withLock { s in
            for t in samples { s.add(Int64(max(0, now - t) * 1e9), bounds) }
        }
    }

    /// Records one observation of `ns` nanoseconds (a negative one counts as 0).
    func record(nanoseconds ns: Int64) {
        let bounds = self.bounds
        state.withLock { s in s.add(max(0, ns), bounds) }
    }

    var count: Int { state.withLock { $0.count } }

    /// Appends the histogram in Prometheus's text format (0.0.4), `# TYPE` line first.
    func emit(into out: inout [UInt8]) {
        let (counts, sum, count) = state.withLock { ($0.counts, $0.sum, $0.count) }
        out.append(contentsOf: "# TYPE \(name) histogram\n".utf8)
        var cumulative = 0
        for (i, bound) in bounds.enumerated() {
            cumulative += counts[i]
            out.append(contentsOf: "\(name)_bucket{le=\"\(Self.seconds(bound))\"} \(cumulative)\n".utf8)
        }
        out.append(contentsOf: "\(name)_bucket{le=\"+Inf\"} \(count)\n".utf8)
        out.append(contentsOf: "\(name)_sum \(Self.seconds(sum))\n".utf8)
        out.append(contentsOf: "\(name)_count \(count)\n".utf8)
    }

    /// Nanoseconds as seconds the way swift-prometheus spells a `Duration`:
    /// whole seconds, a point, the fraction without trailing zeros ("0" when none).
    static func seconds(_ ns: Int64) -> String {
        let whole = ns / 1_000_000_000
        var frac = ns % 1_000_000_000
        guard frac != 0 else { return "\(whole).0" }
        var digits = 9
        while frac % 10 == 0 {
            frac /= 10
            digits -= 1
        }
        let text = String(frac)
        return "\(whole)." + String(repeating: "0", count: digits - text.count) + text
    }
}
