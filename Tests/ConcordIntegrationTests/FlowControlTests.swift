import ConcordJSON
import ConcordTestServer
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 9: memory is bounded by configuration whatever clients do; a
/// flooding or never-reading client slows only itself; a slow subscriber is
/// coalesced (PROTOCOL.md §6.6), never dropped while it reads.
@Suite(.serialized)
struct FlowControlTests {
    /// Resident bytes of the server process.
    static func rss(_ server: ServerProcess) -> Int {
        guard let text = try? String(contentsOfFile: "/proc/\(server.process.processIdentifier)/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            let kb = line.split(separator: " ").compactMap { Int($0) }.first ?? 0
            return kb * 1024
        }
        return 0
    }

    /// Writes `line` over and over on its own thread, never reading, until stopped.
    final class Flooder: @unchecked Sendable {
        // Sendable: `stop` is only set once; `sent` is read after the thread ends.
        let client: WireClient
        private let lock = NSLock()
        private var stopped = false
        private(set) var sent = 0
        private let done = DispatchSemaphore(value: 0)

        init(_ client: WireClient, line: @escaping @Sendable (Int) -> String) {
            self.client = client
            let t = Thread { [self] in
                var i = 0
                var chunk: [UInt8] = []
                while !self.isStopped {
                    chunk.removeAll(keepingCapacity: true)
                    for _ in 0..<200 {
                        chunk.append(contentsOf: line(i).utf8)
                        chunk.append(0x0A)
                        i += 1
                    }
                    if (try? client.write(chunk)) == nil { break }
                    self.lock.lock(); self.sent = i; self.lock.unlock()
                }
                self.done.signal()
            }
            t.start()
        }

        var isStopped: Bool { lock.lock(); defer { lock.unlock() }; return stopped }

        /// Unblocks a write the server stopped reading, and waits for the thread.
        func stop() {
            lock.lock(); stopped = true; lock.unlock()
            shutdown(client.fd, Int32(SHUT_WR))
            _ = done.wait(timeout: .now() + 20)
        }
    }

    @Test func aFloodingWriterSlowsOnlyItself() throws {
        let server = try ServerProcess(arguments: ["--max-inbox-bytes", "4194304", "--max-input-bytes", "1048576"])
        let reader = try server.connect()
        try reader.request(#"{"op":"subscribe","sub":"r","key":"flood"}"#)
        let pinger = try server.connect()
        let flood = Flooder(try server.connect()) { i in
            #"{"op":"update","key":"flood","model":{"id":"F:1","n":\#(i),"pad":"\#(String(repeating: "x", count: 100))"}}"#
        }
        var peak = 0
        var lastSeen = -1
        // While the flood goes on, every ping is answered (a ping stuck behind
        // the flood would hit the client's read timeout and fail the test).
        for _ in 0..<40 {
            #expect(try pinger.request(#"{"op":"ping"}"#)["ok"] == true)
            usleep(100_000)
            // The reader keeps receiving, never older values.
            reader.setTimeout(2)
            if let e = try reader.readJSON(), let n = e["model"]?["n"]?.numberValue?.intValue {
                #expect(n >= lastSeen)
                lastSeen = n
            }
            peak = max(peak, Self.rss(server))
        }
        // Each ping came from an idle connection: a newcomer, given a round
        // of its own before the flood's lines (Sequencer.isNewcomer).
        let text = try pinger.request(#"{"op":"stats","prometheus":true}"#)["prometheus"]?.stringValue ?? ""
        let rounds = text.split(separator: "\n").first { $0.hasPrefix("concord_newcomer_rounds_total ") }
            .flatMap { Int($0.split(separator: " ").last ?? "") } ?? -1
        #expect(rounds >= 40, "newcomer rounds: \(rounds)")
        flood.stop()
        // A flood: the writer sent more than the server lets one connection
        // have unprocessed (`--max-input-bytes`), so flow control held it.
        // (A count of lines, 10,000, was what the debug build reaches; under
        // ThreadSanitizer, with the other suites on both vCPUs, the server
        // answered 9,600 in the window, more than the bound all the same.)
        let shortest = #"{"op":"update","key":"flood","model":{"id":"F:1","n":0,"pad":"\#(String(repeating: "x", count: 100))"}}"#.utf8.count + 1
        #expect(flood.sent * shortest > 1_048_576, "the flood was not a flood: \(flood.sent) lines")
        #expect(lastSeen > 0, "the reader got no event")
        // Bound: inbox 4 MiB + per-connection input/output limits + the store
        // (one document) + runtime; far below what an unbounded inbox reached
        // (GBs). A sanitizer's shadow memory makes RSS meaningless.
        if !Sanitizer.active { #expect(peak < 256 << 20, "peak RSS \(peak >> 20) MiB") }
        #expect(try pinger.request(#"{"op":"stats"}"#)["ok"] == true)
        #expect(server.stop() == 0)
    }

    /// Requests from idle connections go ahead of a pipelining writer's
    /// lines (Sequencer: newcomers), but every turn's first round serves
    /// every lane: twenty clients that each keep one request in flight —
    /// every one of them a newcomer — slow the writer, never stop it, and
    /// every request of theirs is answered in order.
    /// `costly`: each newcomer request costs more than a turn's budget over
    /// their number (a model with 3,000 members), so newcomers alone fill
    /// every turn — as they do on a slow machine (this test under
    /// ThreadSanitizer got 0 answers in 60 s before stop 46).
    @Test(arguments: [false, true])
    func newcomersNeverStarveAPipeliningWriter(costly: Bool) throws {
        let server = try ServerProcess()
        let pad = costly ? ",\"pad\":[" + (0..<3000).map(String.init).joined(separator: ",") + "]" : ""
        let writer = try server.connect()
        // The writer pipelines windows of 200 updates and reads every answer.
        final class Counter: @unchecked Sendable {
            // Sendable: guarded by `lock`.
            let lock = NSLock()
            var answered = 0
            var stop = false
            func add(_ n: Int) { lock.lock(); answered += n; lock.unlock() }
            var value: Int { lock.lock(); defer { lock.unlock() }; return answered }
            var stopped: Bool { lock.lock(); defer { lock.unlock() }; return stop }
            func halt() { lock.lock(); stop = true; lock.unlock() }
        }
        let counter = Counter()
        let writerDone = DispatchSemaphore(value: 0)
        Thread {
            var i = 0
            while !counter.stopped {
                var chunk = ""
                for _ in 0..<200 {
                    chunk += #"{"op":"update","key":"w","model":{"id":"W:1","n":\#(i)}}"# + "\n"
                    i += 1
                }
                guard (try? writer.write(chunk)) != nil else { break }
                for _ in 0..<200 {
                    guard let r = try? writer.response(), r["ok"] == true else { writerDone.signal(); return }
                }
                counter.add(200)
            }
            writerDone.signal()
        }.start()
        let clients = try (0..<20).map { _ in try server.connect() }
        let group = DispatchGroup()
        final class Failures: @unchecked Sendable {
            // Sendable: guarded by `lock`.
            let lock = NSLock()
            var list: [String] = []
            func add(_ s: String) { lock.lock(); list.append(s); lock.unlock() }
        }
        let failures = Failures()
        let before = counter.value
        // Each client's last request number (what a get must return at the end).
        final class Last: @unchecked Sendable {
            // Sendable: guarded by `lock` (an array's element written from
            // twenty threads is a write of the whole array).
            let lock = NSLock()
            private var numbers = [Int](repeating: -1, count: 20)
            func set(_ k: Int, _ n: Int) { lock.lock(); numbers[k] = n; lock.unlock() }
            func of(_ k: Int) -> Int { lock.lock(); defer { lock.unlock() }; return numbers[k] }
        }
        let last = Last()
        let deadline = Date().addingTimeInterval(60)
        for (k, c) in clients.enumerated() {
            group.enter()
            Thread {
                // At least 100 requests each, one in flight, a short pause
                // between: idle for a millisecond or more, so each one is a
                // newcomer. They go on until the writer has had a window
                // answered meanwhile (or a minute passed): on a loaded
                // machine (a sanitizer, the other suites beside it) 100
                // requests can take less time than one window of the writer,
                // which is speed, not starvation.
                var n = 0
                while n < 100 || (counter.value - before < 200 && Date() < deadline) {
                    var r: JSON?
                    do { r = try c.request(#"{"op":"update","key":"c\#(k)","model":{"id":"C:\#(k)","n":\#(n)\#(pad)}}"#) } catch { failures.add("client \(k) request \(n): \(error)") }
                    if let r, r["ok"] != true { failures.add("client \(k) request \(n): \(r.compactString.prefix(300))") }
                    last.set(k, n)
                    n += 1
                    usleep(1_500)
                }
                group.leave()
            }.start()
        }
        #expect(group.wait(timeout: .now() + 180) == .success, "the interactive clients did not finish")
        let during = counter.value - before
        counter.halt()
        #expect(writerDone.wait(timeout: .now() + 60) == .success)
        #expect(failures.list.isEmpty, "\(failures.list.prefix(3))")
        // Liveness, not speed: the writer kept getting answers while newcomer
        // requests went ahead of it — one of its windows at least, within a
        // minute of newcomers arriving without pause. (Measured in stop 38
        // over 2,000 newcomer requests: 3,000–4,800 in a debug build; under
        // TSan 200–400 alone, and 200 with the whole suite and a fuzzer on
        // the two vCPUs. Stop 41's TSan run with the whole suite got 0 in
        // those 2,000 requests — the test then took 44 s, 2.5 s alone —
        // which is why the clients now go on until the writer is answered.)
        #expect(during >= 200, "the writer got \(during) answers meanwhile")
        // Each client's last write is what a get returns: nothing lost or reordered.
        let probe = try server.connect()
        for k in 0..<20 {
            #expect(try probe.request(#"{"op":"get","key":"c\#(k)"}"#)["model"]?["n"] == JSON.number(JSONNumber(last.of(k))))
        }
        #expect(server.stop() == 0)
    }

    @Test func aClientThatWritesAndNeverReadsIsNotReadFurther() throws {
        let server = try ServerProcess(arguments: ["--output-soft-bytes", "262144"])
        let other = try server.connect()
        let flood = Flooder(try server.connect()) { i in #"{"op":"ping","rid":\#(i)}"# }
        var peak = 0
        for _ in 0..<30 {
            usleep(100_000)
            peak = max(peak, Self.rss(server))
            #expect(try other.request(#"{"op":"ping"}"#)["ok"] == true)
        }
        let stats = try other.request(#"{"op":"stats"}"#)
        #expect(stats["connections"] == 2, "the non-reader is not dropped: its output is bounded instead")
        flood.stop()
        if !Sanitizer.active { #expect(peak < 128 << 20, "peak RSS \(peak >> 20) MiB") }
        #expect(server.stop() == 0)
    }

    @Test func aReadingSubscriberIsNeverDroppedAndSeesTheFinalValue() throws {
        let server = try ServerProcess(arguments: ["--max-output-bytes", "1048576", "--output-soft-bytes", "65536"], environment: internalChecks)
        let sub = try server.connect()
        try sub.request(#"{"op":"subscribe","sub":"k","key":"k"}"#)
        try sub.request(#"{"op":"subscribe","sub":"f","feed":{}}"#)
        let writer = try server.connect()
        let blob = String(repeating: "y", count: 2000)
        // Pipelined batches of big updates, no waiting.
        let total = 3000
        var text = ""
        for i in 0..<total {
            text += #"{"op":"batch","ops":[{"op":"update","key":"k","model":{"id":"K","v":\#(i),"blob":"\#(blob)"}},{"op":"update","model":{"id":"E:\#(i % 7)","v":\#(i)}}]}"# + "\n"
        }
        let bytes = Array(text.utf8)
        let w = Thread { try? writer.write(bytes) }
        w.start()
        // The writer reads its responses as they come: a writer that does not
        // is itself flow-controlled once its unread responses fill its socket
        // (how soon depends on how many responses each write carries).
        let responses = Flag()
        let r = Thread {
            for _ in 0..<total { guard (try? writer.response()) != nil else { return } }
            responses.set()
        }
        r.start()
        var lastK = -1
        var coalesced = 0
        var eof = false
        sub.setTimeout(10)
        while lastK < total - 1 {
            guard let e = try sub.readJSON() else { eof = true; break }
            if e["coalesced"] == true { coalesced += 1 }
            if e["sub"] == "k", let v = e["model"]?["v"]?.numberValue?.intValue {
                #expect(v >= lastK, "older value after newer")
                lastK = v
            }
        }
        #expect(!eof, "a reading subscriber was dropped")
        #expect(lastK == total - 1)
        try waitUntil("the writer to read its \(total) responses") { responses.isSet }
        #expect(try sub.request(#"{"op":"get","key":"k"}"#)["model"]?["v"] == .int(total - 1))
        #expect(!server.stderr.contains("stopped reading"))
        // Whether this run coalesced depends on the reader's speed; say what happened.
        print("reading subscriber: \(coalesced) coalesced events")
        #expect(server.stop() == 0)
    }

    /// The loop writes straight to the socket first and hands what it did
    /// not take to a write request (Server+Writing.swift): events larger
    /// than the socket's buffer, to a subscriber that reads nothing until
    /// all are sent, must arrive whole and in order — each split at another
    /// place (a wrong offset in the rest would lose or repeat bytes).
    @Test func outputLargerThanTheSocketBufferArrivesWholeAndInOrder() throws {
        let server = try ServerProcess(arguments: ["--max-output-bytes", "67108864", "--output-soft-bytes", "33554432"], environment: internalChecks)
        let sub = try server.connect()
        try sub.request(#"{"op":"subscribe","sub":"s","key":"k"}"#)
        let writer = try server.connect()
        let sizes = [300_000, 70_001, 1_000_003, 5, 250_007, 131_071]
        func blob(_ i: Int) -> String { String(repeating: Character(Unicode.Scalar(UInt8(97 + i))), count: sizes[i]) }
        for i in sizes.indices {
            try writer.send(#"{"op":"update","key":"k","model":{"id":"K","v":\#(i),"blob":"\#(blob(i))"}}"#)
            #expect(try writer.response()["seq"] == .int(i + 1))
        }
        sub.setTimeout(10)
        for i in sizes.indices {
            let e = try #require(try sub.readJSON(), "event \(i) did not arrive")
            #expect(e["model"]?["v"] == .int(i))
            let text = e["model"]?["blob"]?.stringValue
            #expect(text?.utf8.count == sizes[i])
            // Not the strings themselves: a failure would print megabytes.
            let same = text == blob(i)
            #expect(same, "event \(i)'s blob differs from the one written")
        }
        #expect(try sub.request(#"{"op":"ping"}"#)["ok"] == true)
        #expect(server.stop() == 0)
    }

    @Test func aSubscriberThatStopsReadingIsCoalescedThenCatchesUp() throws {
        let server = try ServerProcess(arguments: ["--max-output-bytes", "65536", "--output-soft-bytes", "16384"], environment: internalChecks)
        let slow = try server.connect()
        try slow.request(#"{"op":"subscribe","sub":"s","key":"k"}"#)
        let fast = try server.connect()
        try fast.request(#"{"op":"subscribe","sub":"s","key":"k"}"#)
        let writer = try server.connect()
        let blob = String(repeating: "y", count: 4000)
        for i in 0..<400 {
            try writer.send(#"{"op":"update","key":"k","model":{"id":"K","v":\#(i),"blob":"\#(blob)"}}"#)
            #expect(try writer.response()["seq"] == .int(i + 1))
            if i % 50 == 49 {
                while try fast.readJSON()?["model"]?["v"] != .int(i) {}
            }
        }
        // Far more than the hard limit was published; the slow one holds at most
        // a few events' worth and is still connected.
        #expect(try writer.request(#"{"op":"stats"}"#)["connections"] == 3)
        var last = -1
        var sawCoalesced = false
        slow.setTimeout(10)
        while last < 399 {
            guard let e = try slow.readJSON() else { Issue.record("slow subscriber was dropped"); break }
            if e["coalesced"] == true { sawCoalesced = true }
            if let v = e["model"]?["v"]?.numberValue?.intValue {
                #expect(v > last)
                last = v
            }
        }
        #expect(sawCoalesced)
        #expect(try slow.request(#"{"op":"ping"}"#)["ok"] == true)
        #expect(!server.stderr.contains("stopped reading"))
        #expect(server.stop() == 0)
    }
}

/// A one-way flag shared between a test and a thread it started.
final class Flag: @unchecked Sendable {
    // Sendable: guarded by `lock`.
    private let lock = NSLock()
    private var value = false
    func set() { lock.withLock { value = true } }
    var isSet: Bool { lock.withLock { value } }
}
