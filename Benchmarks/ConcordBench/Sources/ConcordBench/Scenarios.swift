import Foundation
import Histogram

#if canImport(Glibc)
import Glibc
#endif

/// Counters shared between a scenario's threads.
final class Tally: @unchecked Sendable {
    // Sendable: every member is guarded by `lock`.
    private let lock = NSLock()
    private var events = 0
    private var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)

    func add(events n: Int) { lock.withLock { events += n } }
    var total: Int { lock.withLock { events } }

    func merge(_ h: Histogram<UInt64>) { lock.withLock { histogram.add(h) } }
    func percentile(_ p: Double) -> Double { lock.withLock { Double(histogram.valueAtPercentile(p)) / 1000 } }
    var samples: UInt64 { lock.withLock { histogram.totalCount } }
}

/// Opens `connections` subscriber connections, each watching `perConnection`
/// channels (connection k watches k*stride ..< k*stride+perConnection), and
/// starts a reader thread per connection that counts events (and, with
/// `latency`, records each event's age).
final class Subscribers: @unchecked Sendable {
    // Sendable: each connection is used by its own reader thread only after start.
    let conns: [Conn]
    let tally = Tally()
    private let done = DispatchGroup()
    private let stop = ManagedFlag()

    init(_ system: any System, connections: Int, perConnection: Int, stride: Int, model: Bool = false, distinct: Bool = false) throws {
        var list: [Conn] = []
        for k in 0..<connections {
            let c = try Conn(system.socket)
            let (bytes, replies) = system.subscribe((k * stride)..<(k * stride + perConnection), model: model, distinct: distinct, viewer: k)
            c.write(bytes)
            system.readReplies(c, replies)
            list.append(c)
        }
        conns = list
    }

    func start(_ system: any System, latency: Bool) {
        for c in conns {
            done.enter()
            let marker = system.eventMarker
            let tally = self.tally
            let stop = self.stop
            let group = done
            Thread {
                c.setTimeout(0.2)
                var counter = PatternCounter(marker)
                var scanner = NumberScanner("t")
                var h = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
                var reported = 0
                while !stop.isSet {
                    _ = c.readChunk { bytes in
                        counter.feed(bytes)
                        if latency {
                            let now = nowNanos()
                            scanner.feed(bytes) { t in if t > 0 && t <= now { h.record(now - t) } }
                        }
                    }
                    if counter.count != reported {
                        tally.add(events: counter.count - reported)
                        reported = counter.count
                    }
                }
                if latency { tally.merge(h) }
                group.leave()
            }.start()
        }
    }

    /// Waits until `expected` events arrived (or `timeout`); returns when the last one did.
    func waitFor(_ expected: Int, timeout: Double) -> UInt64 {
        let deadline = nowNanos() + UInt64(timeout * 1e9)
        while tally.total < expected && nowNanos() < deadline { usleep(1000) }
        return nowNanos()
    }

    func finish() {
        stop.set()
        done.wait()
    }
}

final class ManagedFlag: @unchecked Sendable {
    // Sendable: guarded by `lock`.
    private let lock = NSLock()
    private var value = false
    func set() { lock.withLock { value = true } }
    var isSet: Bool { lock.withLock { value } }
}

/// Writers that publish to random channels in `range`, pipelined in windows of
/// `window` requests, for `duration` seconds (or paced at `rate` per second).
func runWriters(_ system: any System, writers: Int, channels: Range<Int>, duration: Double, rate: Double? = nil,
                window: Int = 128) throws -> (updates: Int, started: UInt64) {
    let conns = try (0..<writers).map { _ in try Conn(system.socket) }
    let counts = Tally()
    let group = DispatchGroup()
    let start = nowNanos()
    let end = start + UInt64(duration * 1e9)
    for (w, c) in conns.enumerated() {
        group.enter()
        Thread {
            var rng = SystemRandomNumberGenerator()
            var sent = 0
            if let rate {
                // Paced: send what is due every millisecond, acknowledge in a reader thread.
                let perWriter = rate / Double(writers)
                let acks = ManagedFlag()
                let reader = Thread {
                    c.setTimeout(0.5)
                    while !acks.isSet { _ = c.readChunk { _ in } }
                }
                reader.start()
                while nowNanos() < end {
                    let due = Int(perWriter * Double(nowNanos() - start) / 1e9)
                    if due > sent {
                        var buf: [UInt8] = []
                        for k in sent..<due { buf += system.publish(Int.random(in: channels, using: &rng), stamp: nowNanos(), unique: w << 40 | k) }
                        c.write(buf)
                        sent = due
                    }
                    usleep(200)
                }
                acks.set()
            } else {
                while nowNanos() < end {
                    var buf: [UInt8] = []
                    for k in 0..<window { buf += system.publish(Int.random(in: channels, using: &rng), stamp: nowNanos(), unique: w << 40 | (sent + k)) }
                    c.write(buf)
                    // Every reply is one line for Concord and one ":n" line for Redis.
                    c.skipLines(window)
                    sent += window
                }
            }
            counts.add(events: sent)
            group.leave()
        }.start()
    }
    group.wait()
    return (counts.total, start)
}

struct Throughput {
    var updatesPerSecond: Double
    var eventsPerSecond: Double
    /// The server's CPU time (utime + stime, all threads) over the measured interval.
    var serverCPUSeconds: Double
    var events: Int
    /// Delivered events per second of server CPU: the steadier figure on two
    /// vCPUs shared with the load generator.
    var eventsPerCPUSecond: Double { events > 0 && serverCPUSeconds > 0 ? Double(events) / serverCPUSeconds : 0 }
}

/// Dense or sparse fan-out: `subscribers` connections × `perConnection` channels.
func fanout(_ system: any System, server: ServerProc, subscribers: Int, perConnection: Int, stride: Int, channels: Int,
            duration: Double, model: Bool = false, distinct: Bool = false, writers: Int = 2) throws -> Throughput {
    let subs = try Subscribers(system, connections: subscribers, perConnection: perConnection, stride: stride, model: model, distinct: distinct)
    subs.start(system, latency: false)
    let cpu0 = cpuSeconds(server.pid)
    let (updates, start) = try runWriters(system, writers: writers, channels: 0..<channels, duration: duration)
    // Each update reaches every connection watching its channel.
    let watchersPerChannel = stride == 0 ? subscribers : 1
    let expected = updates * watchersPerChannel
    let finished = subs.waitFor(expected, timeout: 30)
    let cpu = cpuSeconds(server.pid) - cpu0
    let delivered = subs.tally.total
    subs.finish()
    if delivered < expected {
        FileHandle.standardError.write(Data("  warning: \(system.name) delivered \(delivered) of \(expected) events within the wait\n".utf8))
    }
    let elapsed = Double(finished - start) / 1e9
    return Throughput(updatesPerSecond: Double(updates) / elapsed, eventsPerSecond: Double(delivered) / elapsed,
                      serverCPUSeconds: cpu, events: delivered)
}

struct Latency {
    var p50: Double
    var p99: Double
    var p999: Double
    var samples: UInt64
}

func latency(_ system: any System, subscribers: Int, perConnection: Int, rate: Double, duration: Double) throws -> Latency {
    let subs = try Subscribers(system, connections: subscribers, perConnection: perConnection, stride: perConnection)
    subs.start(system, latency: true)
    let (updates, _) = try runWriters(system, writers: 1, channels: 0..<(subscribers * perConnection), duration: duration, rate: rate)
    _ = subs.waitFor(updates, timeout: 10)
    subs.finish()
    return Latency(p50: subs.tally.percentile(50), p99: subs.tally.percentile(99), p999: subs.tally.percentile(99.9),
                   samples: subs.tally.samples)
}

struct Memory {
    var allocatorBytesPerSubscription: Double
    var rssBytesPerSubscription: Double
}

/// Bytes per subscription: `count` distinct channels over connections of at most 50k each.
func memoryPerSubscription(_ system: any System, server: ServerProc, count: Int) throws -> Memory {
    let probe = try Conn(system.socket)
    let before = system.memoryInUse(probe)
    let rssBefore = server.rssBytes
    var conns: [Conn] = []
    var i = 0
    while i < count {
        let n = min(50_000, count - i)
        let c = try Conn(system.socket)
        var k = 0
        while k < n {
            let m = min(5000, n - k)
            let (bytes, replies) = system.subscribe((i + k)..<(i + k + m), model: false)
            c.write(bytes)
            system.readReplies(c, replies)
            k += m
        }
        conns.append(c)
        i += n
    }
    usleep(300_000)
    let after = system.memoryInUse(probe)
    let rssAfter = server.rssBytes
    withExtendedLifetime(conns) {}
    return Memory(allocatorBytesPerSubscription: Double(after - before) / Double(count),
                  rssBytesPerSubscription: Double(rssAfter - rssBefore) / Double(count))
}

/// Collection churn (Concord only): head insert, head remove and item update
/// on an `size`-item collection with `subscribers` subscribers; ops/s until
/// every subscriber has every event.
func collectionChurn(socket: String, size: Int, subscribers: Int, ops: Int) throws -> Double {
    let name = "churn\(size)"
    let w = try Conn(socket)
    var i = 0
    while i < size {
        let n = min(5000, size - i)
        let items = (i..<(i + n)).map { #"{"id":"I:\#(name):\#($0)","n":\#($0)}"# }.joined(separator: ",")
        w.write(#"{"op":"collection.insert","collection":"\#(name)","items":[\#(items)]}"# + "\n")
        w.skipLines(1)
        i += n
    }
    let subs = try (0..<subscribers).map { k -> Conn in
        let c = try Conn(socket)
        c.write(#"{"op":"subscribe","sub":"c\#(k)","collection":"\#(name)"}"# + "\n")
        _ = c.readLine()
        return c
    }
    let tally = Tally()
    let stop = ManagedFlag()
    let group = DispatchGroup()
    for c in subs {
        group.enter()
        Thread {
            c.setTimeout(0.2)
            var counter = PatternCounter(#""event":"#)
            var reported = 0
            while !stop.isSet {
                _ = c.readChunk { counter.feed($0) }
                if counter.count != reported {
                    tally.add(events: counter.count - reported)
                    reported = counter.count
                }
            }
            group.leave()
        }.start()
    }
    let start = nowNanos()
    var sent = 0
    while sent < ops {
        var buf = ""
        let n = min(128, ops - sent)
        for k in 0..<n {
            switch (sent + k) % 3 {
            case 0: buf += #"{"op":"collection.insert","collection":"\#(name)","index":0,"items":[{"id":"I:\#(name):h\#(sent + k)"}]}"# + "\n"
            case 1: buf += #"{"op":"collection.remove","collection":"\#(name)","index":0}"# + "\n"
            default: buf += #"{"op":"update","model":{"id":"I:\#(name):\#((sent + k) % size)","n":-\#(sent + k)}}"# + "\n"
            }
        }
        w.write(buf)
        w.skipLines(n)
        sent += n
    }
    while tally.total < ops * subscribers && seconds(since: start) < 60 { usleep(1000) }
    let elapsed = seconds(since: start)
    stop.set()
    group.wait()
    w.write(#"{"op":"collection.delete","collection":"\#(name)"}"# + "\n")
    _ = w.readLine()
    return Double(ops) / elapsed
}
