// The core's per-operation costs, on one thread, as concord-bench's
// scenarios exercise them over the socket. Each benchmark reports wall clock
// and mallocs per operation (scaledIterations: 1,000 operations per sample).

import Benchmark
import ConcordCore
import ConcordJSON

/// The entity every scenario writes (the same payload concord-bench sends).
func entity(_ i: Int, _ v: Int) -> String {
    #"{"id":"E:\#(i)","t":\#(v),"name":"Ada Lovelace","title":"Analyst","bio":"First to publish an algorithm intended for a machine; notes on the Analytical Engine.","tags":["math","poetry"],"v":\#(v)}"#
}

func line(_ s: String) -> [UInt8] { Array((s + "\n").utf8.dropLast()) }

/// No coalescing: nothing drains the output counters here, and the benchmarks
/// measure the path of a connection that keeps up.
func makeEngine() -> Engine {
    var configuration = EngineConfiguration()
    configuration.outputSoftBytes = 0
    configuration.internalChecks = false
    return Engine(configuration: configuration)
}

/// An engine holding documents k0..k(n-1), document k_i holding entity E:i.
func engine(documents n: Int) -> Engine {
    let e = makeEngine()
    e.open(0)
    for i in 0..<n { e.handleLine(line(#"{"op":"update","key":"k\#(i)","model":\#(entity(i, 0))}"#), from: 0) }
    _ = e.takeOutput()
    return e
}

/// Pre-built update lines (so the benchmark measures the engine, not string building).
func updates(_ count: Int, channels: Int) -> [[UInt8]] {
    (0..<count).map { k in line(#"{"op":"update","model":\#(entity(k % channels, k + 1))}"#) }
}

/// Updates of random entities E:0..99 (each in document k_i), measured with
/// `subscribers` connections each subscribed with `subscribe(i)` for i in 0..<100.
func measureUpdates(_ b: Benchmark, subscribers: Int, subscribe: (Int) -> String) {
    let e = engine(documents: 100)
    if subscribers > 0 {
        for c in 1...subscribers {
            e.open(c)
            for i in 0..<100 { e.handleLine(line(subscribe(i)), from: c) }
        }
    }
    _ = e.takeOutput()
    let lines = updates(b.scaledIterations.count, channels: 100)
    b.startMeasurement()
    for l in lines {
        e.handleLine(l, from: 0)
        blackHole(e.takeOutput())
    }
}

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(metrics: [.wallClock, .mallocCountTotal, .throughput],
                                           scalingFactor: .kilo, maxDuration: .seconds(3))

    Benchmark("parse: one 230-byte update line") { b in
        let parser = JSONParser()
        let l = updates(1, channels: 1)[0]
        for _ in b.scaledIterations { blackHole(try? parser.parse(l)) }
    }

    Benchmark("encode: one entity value") { b in
        let value = try! JSONParser().parse(Array(entity(1, 1).utf8))
        for _ in b.scaledIterations { blackHole(value.encoded()) }
    }

    Benchmark("update: no subscribers (the pipelined writer)") { b in
        measureUpdates(b, subscribers: 0, subscribe: { _ in "" })
    }

    Benchmark("update: one key subscriber (dense fan-out, 1 connection)") { b in
        measureUpdates(b, subscribers: 1, subscribe: { i in #"{"op":"subscribe","sub":"k\#(i)","key":"k\#(i)"}"# })
    }

    Benchmark("update: 100 key subscribers (dense fan-out, 100 connections)") { b in
        measureUpdates(b, subscribers: 100, subscribe: { i in #"{"op":"subscribe","sub":"k\#(i)","key":"k\#(i)"}"# })
    }

    Benchmark("update: one model-view subscriber") { b in
        measureUpdates(b, subscribers: 1, subscribe: { i in #"{"op":"subscribe","sub":"m\#(i)","model":\#(entity(i, 0))}"# })
    }

    Benchmark("subscribe: one key subscription on a distinct key") { b in
        let e = makeEngine()
        e.open(1)
        let lines = (0..<b.scaledIterations.count).map { i in line(#"{"op":"subscribe","sub":"k\#(i)","key":"k\#(i)"}"#) }
        b.startMeasurement()
        for l in lines {
            e.handleLine(l, from: 1)
            blackHole(e.takeOutput())
        }
    }
}
