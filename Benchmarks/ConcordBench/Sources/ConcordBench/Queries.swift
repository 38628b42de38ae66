import Foundation
import Histogram

#if canImport(Glibc)
import Glibc
#endif

/// Live queries (Concord only; Redis has nothing like them): `entities`
/// posts by `authors` people; `subscriptions` query subscriptions over
/// `connections` connections, each one of `authors` definitions — "the 20
/// newest posts of author A" — so `subscriptions / authors` subscribers share
/// each view. A writer then sends `rate` updates per second for `duration`
/// (merges): half give a post a new date (it moves to the top of its
/// author's list), three in ten give a post another author (it leaves one
/// list and enters another), two in ten rename an author (a nested entity
/// each of their ~100 posts holds: every one of them changes). Latency is measured per mutation: from the
/// writer's send to each event of that `seq` read by a subscriber.
struct QueryResult {
    var p50: Double
    var p99: Double
    var eventsPerSecond: Double
    var updatesPerSecond: Double
    /// Server CPU per applied update (µs): what must stay flat as queries grow.
    var cpuMicrosPerUpdate: Double
    /// Allocator bytes per query view (one definition, with its first subscription) and per further subscription.
    var bytesPerView: Double
    var bytesPerSubscription: Double
    var setupSeconds: Double
}

private func allocated(_ c: Conn) -> Int {
    c.write(#"{"op":"stats"}"# + "\n")
    guard let line = c.readLine(), let text = String(bytes: line, encoding: .utf8),
          let r = text.range(of: #""allocated":"#) else { return 0 }
    return Int(text[r.upperBound...].prefix { $0.isNumber }) ?? 0
}

/// `indexed`: false gives each definition a range of dates instead of an
/// author (`date ≥ a·k and date < (a+1)·k`, entities/views members each): a
/// predicate the server cannot index, so every changed post is tested
/// against every view. `views` (default: one per author) sets how many.
func queryScenario(server: ServerProc, socket: String, entities: Int, authors: Int, subscriptions: Int,
                   connections: Int, rate: Double, duration: Double, indexed: Bool = true, views: Int? = nil) throws -> QueryResult {
    let setupStart = nowNanos()
    let w = try Conn(socket)
    // Posts i: author i % authors, date i.
    var buf = ""
    var pending = 0
    for i in 0..<entities {
        let a = i % authors
        buf += #"{"op":"update","model":{"id":"Post:\#(i)","date":\#(i),"title":"Post number \#(i)","author":{"id":"Person:\#(a)","name":"Person \#(a)"}}}"# + "\n"
        pending += 1
        if pending == 2000 {
            w.write(buf)
            w.skipLines(pending)
            buf = ""
            pending = 0
        }
    }
    w.write(buf)
    w.skipLines(pending)

    let definitions = views ?? authors
    let span = entities / definitions
    func definition(_ a: Int) -> String {
        if !indexed {
            return #"{"type":"Post","where":{"all":[{"path":"date","gte":\#(a * span)},{"path":"date","lt":\#((a + 1) * span)}]},"order":[{"path":"date","desc":true}],"limit":20}"#
        }
        return #"{"type":"Post","where":{"path":"author.id","eq":"Person:\#(a)"},"order":[{"path":"date","desc":true}],"limit":20}"#
    }
    let probe = try Conn(socket)
    let conns = try (0..<connections).map { _ in try Conn(socket) }
    // Stage A: one subscription per definition (every view is built).
    let before = allocated(probe)
    var k = 0
    func subscribe(_ n: Int) {
        var perConn = [String](repeating: "", count: connections)
        var counts = [Int](repeating: 0, count: connections)
        for _ in 0..<n {
            let c = k % connections
            perConn[c] += #"{"op":"subscribe","sub":"q\#(k)","query":\#(definition(k % definitions))}"# + "\n"
            counts[c] += 1
            k += 1
        }
        for c in 0..<connections where counts[c] > 0 {
            conns[c].write(perConn[c])
            conns[c].skipLines(counts[c])
        }
    }
    if subscriptions > 0 { subscribe(min(definitions, subscriptions)) }
    let afterViews = allocated(probe)
    subscribe(subscriptions - min(definitions, subscriptions))
    let afterSubs = allocated(probe)
    let views = min(definitions, subscriptions)
    let extra = subscriptions - views
    let perSub = extra > 0 ? Double(afterSubs - afterViews) / Double(extra) : 0
    let setup = seconds(since: setupStart)

    // Readers: count events, note the arrival of each seq.
    let stop = ManagedFlag()
    let group = DispatchGroup()
    final class Collected: @unchecked Sendable {
        // Sendable: guarded by `lock`.
        let lock = NSLock()
        var arrivals: [(seq: Int, at: UInt64)] = []
        var events = 0
    }
    let collected = Collected()
    for c in conns {
        group.enter()
        Thread {
            c.setTimeout(0.2)
            var scanner = NumberScanner("seq")
            var local: [(Int, UInt64)] = []
            var n = 0
            while !stop.isSet {
                _ = c.readChunk { bytes in
                    let now = nowNanos()
                    scanner.feed(bytes) { seq in
                        local.append((Int(seq), now))
                        n += 1
                    }
                }
            }
            collected.lock.withLock {
                collected.arrivals.append(contentsOf: local)
                collected.events += n
            }
            group.leave()
        }.start()
    }

    // The writer: paced, pipelined; responses give each write its seq.
    var rng = SystemRandomNumberGenerator()
    var sentAt: [UInt64] = []
    let cpuBefore = cpuSeconds(server.pid)
    let start = nowNanos()
    let interval = 1e9 / rate
    var sent = 0
    while seconds(since: start) < duration {
        let due = Int(Double(nowNanos() - start) / interval) + 1
        var lines = ""
        while sent < due {
            let r = Int.random(in: 0..<10, using: &rng)
            let p = Int.random(in: 0..<entities, using: &rng)
            // Merges: the post's other members and its author's name stay as stored.
            if r < 5 {
                lines += #"{"op":"update","mode":"merge","model":{"id":"Post:\#(p)","date":\#(entities + sent)}}"# + "\n"
            } else if r < 8 {
                let a = Int.random(in: 0..<authors, using: &rng)
                lines += #"{"op":"update","mode":"merge","model":{"id":"Post:\#(p)","author":{"id":"Person:\#(a)"}}}"# + "\n"
            } else {
                let a = Int.random(in: 0..<authors, using: &rng)
                lines += #"{"op":"update","model":{"id":"Person:\#(a)","name":"Person \#(a) renamed \#(sent)"}}"# + "\n"
            }
            sentAt.append(nowNanos())
            sent += 1
        }
        if !lines.isEmpty { w.write(lines) }
        usleep(200)
    }
    // The seq of each write, in order (responses come in request order).
    var seqOf: [Int: UInt64] = [:]
    for i in 0..<sent {
        guard let line = w.readLine(), let text = String(bytes: line, encoding: .utf8),
              let r = text.range(of: #""seq":"#), let seq = Int(text[r.upperBound...].prefix { $0.isNumber }) else { continue }
        seqOf[seq] = sentAt[i]
    }
    let elapsed = seconds(since: start)
    let cpu = cpuSeconds(server.pid) - cpuBefore
    usleep(300_000)
    stop.set()
    group.wait()
    var h = Histogram<UInt64>(highestTrackableValue: 60_000_000_000, numberOfSignificantValueDigits: .three)
    let (arrivals, events) = collected.lock.withLock { (collected.arrivals, collected.events) }
    for (seq, at) in arrivals {
        guard let t = seqOf[seq], at >= t else { continue }
        h.record(at - t)
    }
    withExtendedLifetime((conns, probe)) {}
    return QueryResult(p50: Double(h.valueAtPercentile(50)) / 1000, p99: Double(h.valueAtPercentile(99)) / 1000,
                       eventsPerSecond: Double(events) / elapsed, updatesPerSecond: Double(sent) / elapsed,
                       cpuMicrosPerUpdate: cpu / Double(max(sent, 1)) * 1e6,
                       bytesPerView: Double(afterViews - before) / Double(max(views, 1)),
                       bytesPerSubscription: perSub, setupSeconds: setup)
}
