import Foundation
import Histogram

#if canImport(Glibc)
import Glibc
#endif

/// Server CPU time (user + system) from /proc, in seconds.
/// A process's CPU time, user and system, every thread: from its CPU-time
/// clock (`clock_getcpuclockid`), the scheduler's own count in nanoseconds.
/// /proc's utime and stime are sampled at the timer tick (10 ms here), and
/// a paced workload (a request every 2 ms, a writer that sleeps between
/// windows) can meet the tick in step: those figures moved by ~10 % between
/// runs where this clock did not. /proc is the fallback.
func cpuSeconds(_ pid: Int32) -> Double {
    var clock = clockid_t()
    var t = timespec()
    if clock_getcpuclockid(pid, &clock) == 0, clock_gettime(clock, &t) == 0 {
        return Double(t.tv_sec) + Double(t.tv_nsec) / 1e9
    }
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = text.lastIndex(of: ")") else { return 0 }
    // Fields after the command name: state is field 3; utime and stime are 14 and 15.
    let fields = text[text.index(after: close)...].split(separator: " ")
    guard fields.count > 13, let u = Double(fields[11]), let s = Double(fields[12]) else { return 0 }
    return (u + s) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

struct FloodResult {
    var peakRSS = 0
    var readerEventsPerSecond = 0.0
    var pingP50us = 0.0
    var pingP99us = 0.0
    var pingMaxUs = 0.0
    var pings = 0
    var slowDropped = false
    var slowEvents = 0
    var updatesWritten = 0
    var serverCPUSeconds = 0.0
}

/// Issue 9's shape: one writer that pipelines updates without waiting, 10
/// subscribers reading as fast as they can, one subscriber reading 160 KB/s,
/// and one client pinging every 5 ms. Reports the server's peak RSS, what the
/// readers got, the ping latency, and whether the slow subscriber survived.
func flood(_ system: any System, server: ServerProc, duration: Double) throws -> FloodResult {
    var result = FloodResult()
    let channels = 0..<100
    let readers = try Subscribers(system, connections: 10, perConnection: 100, stride: 0)
    let slow = try Conn(system.socket)
    let (sb, sn) = system.subscribe(channels, model: false)
    slow.write(sb)
    system.readReplies(slow, sn)
    let pinger = try Conn(system.socket)
    let writer = try Conn(system.socket)
    let stop = ManagedFlag()
    let group = DispatchGroup()
    let cpu0 = cpuSeconds(server.pid)
    readers.start(system, latency: false)
    let t0 = nowNanos()

    final class Box: @unchecked Sendable {
        // Sendable: each member is written by one thread and read after `group.wait()`.
        var written = 0
        var slowEvents = 0
        var slowDropped = false
        var pings = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
        var pingCount = 0
    }
    let box = Box()

    group.enter()
    Thread {
        var k = 0
        var chunk: [UInt8] = []
        while !stop.isSet {
            chunk.removeAll(keepingCapacity: true)
            for _ in 0..<256 {
                chunk += system.publish(k % channels.count, stamp: nowNanos(), unique: k)
                k += 1
            }
            writer.write(chunk)  // blocks while the server does not read it
            box.written = k
        }
        group.leave()
    }.start()

    // The writer's responses are read (and dropped) on their own thread: the
    // writer never waits for them, so nothing but the server paces it.
    let drain = DispatchGroup()
    drain.enter()
    Thread {
        while writer.readChunk({ _ in }) {}
        drain.leave()
    }.start()

    group.enter()
    Thread {
        var counter = PatternCounter(system.eventMarker)
        var small = [UInt8](repeating: 0, count: 16 << 10)
        while !stop.isSet {
            usleep(100_000)
            let n = small.withUnsafeMutableBytes { recv(slow.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n == 0 { box.slowDropped = true; break }
            if n > 0 { small.withUnsafeBufferPointer { counter.feed(UnsafeBufferPointer(rebasing: $0[0..<n])) } }
        }
        box.slowEvents = counter.count
        group.leave()
    }.start()

    group.enter()
    Thread {
        let ping: [UInt8] = system.name == "redis" ? resp(["PING"]) : Array("{\"op\":\"ping\"}\n".utf8)
        pinger.setTimeout(30)
        while !stop.isSet {
            let s = nowNanos()
            pinger.write(ping)
            guard pinger.readLine() != nil else { break }
            box.pings.record(nowNanos() - s)
            box.pingCount += 1
            usleep(5_000)
        }
        group.leave()
    }.start()

    while seconds(since: t0) < duration {
        result.peakRSS = max(result.peakRSS, server.rssBytes)
        usleep(50_000)
    }
    let events = readers.tally.total
    let elapsed = seconds(since: t0)
    result.serverCPUSeconds = cpuSeconds(server.pid) - cpu0
    stop.set()
    shutdown(writer.fd, Int32(SHUT_RDWR))
    _ = drain.wait(timeout: .now() + 5)
    readers.finish()
    _ = group.wait(timeout: .now() + 35)
    result.readerEventsPerSecond = Double(events) / elapsed
    result.updatesWritten = box.written
    result.slowEvents = box.slowEvents
    result.slowDropped = box.slowDropped
    result.pings = box.pingCount
    result.pingP50us = Double(box.pings.valueAtPercentile(50)) / 1000
    result.pingP99us = Double(box.pings.valueAtPercentile(99)) / 1000
    result.pingMaxUs = Double(box.pings.max) / 1000
    return result
}
