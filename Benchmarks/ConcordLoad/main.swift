// concord-load: ad-hoc load and measurement tool for concord-server.
// `concord-load --help` lists the commands and their options (LoadOptions
// below). The benchmark next to Redis is Benchmarks/ConcordBench (make bench).

import ArgumentParser
import CJemalloc
import ConcordCore
import ConcordJSON
import ConcordProtocol
import ConcordSocket
import ConcordServer
import Foundation
import Logging

#if canImport(Glibc)
import Glibc
#endif

signal(SIGPIPE, SIG_IGN)

/// The command line (swift-argument-parser): one command word and the options it reads.
struct LoadOptions: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "concord-load",
        abstract: "Ad-hoc load and measurement tool for concord-server.",
        discussion: """
            Commands, with the options each reads [and their defaults]:
              codec        parse/encode MB/s of ConcordJSON [-n 200000]
              core         the engine alone on one thread, no sockets: µs per
                           update [-n 200000 --subs 1 --kind key|model|models|none|rename|posts|range|pages|windows|views]
                           (views: jemalloc bytes per query view and member; with
                           VIEWS_EMPTY=1 the views match nothing: a view's own cost)
              pipeline     pipelined updates/s on one connection [-n 200000]
              fanout       delivered events/s, S subscribers on one view
                           [-s 100 -n 20000 --kind key|model|models|ids]
              subs         jemalloc bytes per key subscription
                           [-n 100000 --shared no]
              collections  one-item update in an N-item collection; head
                           insert/remove churn [-n 100000 -s 10 --ops 2000]
              backend      get/write_batch rates through the ABI
                           [--cache sqlite -n 100000 --cache-config JSON]
              populate     fill a server with N entities [-n 1000000]
              first-get    time to the first get after a start
                           [--id Person:123456]
              cluster-replay  N random mutations from three cluster-mode
                           engines on an in-process log (one joins from a
                           snapshot halfway); prints the state and outcome
                           digests, which must not depend on the process's
                           hash seed [-n 100000]
            The benchmark next to Redis is Benchmarks/ConcordBench (make bench).
            """)

    static let commands = ["codec", "core", "pipeline", "fanout", "subs", "collections", "backend", "populate", "first-get", "cluster-replay"]

    @Argument(help: "What to measure (see below).")
    var command: String

    @Option(help: "Server socket (default: $CONCORD_SOCKET, else the per-user default).")
    var socket: String = DefaultSocket.path

    @Option(name: .customShort("n"), help: "Operations, items or entities (default per command).")
    var count: Int?

    @Option(name: [.customShort("s"), .customLong("subs")], help: "Subscribers or subscriber connections (default per command).")
    var subs: Int?

    @Option(help: "View kind: key, model, ids (fanout); key, model, none, rename, posts, range, pages (core).")
    var kind: String?

    @Option(help: "subs: yes to subscribe every connection to one shared key.")
    var shared: String = "no"

    @Option(help: "collections: head insert/remove operations.")
    var ops: Int = 2000

    @Option(help: "backend: memory, sqlite, hash or a library path.")
    var cache: String = "sqlite"

    @Option(help: "backend: the backend's configuration (JSON).")
    var cacheConfig: String?

    @Option(help: "first-get: the identity to read.")
    var id: String = "Person:123456"

    func validate() throws {
        guard Self.commands.contains(command) else {
            throw ValidationError("unknown command '\(command)'; one of: \(Self.commands.joined(separator: ", "))")
        }
        if let count, count < 1 { throw ValidationError("-n must be at least 1") }
        if let subs, subs < 0 { throw ValidationError("-s/--subs must not be negative") }
    }
}

let options = LoadOptions.parseOrExit()
let command = options.command
let socketPath = options.socket

func now() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

// MARK: A minimal blocking client

final class Client: @unchecked Sendable {
    // Sendable: each instance is used by one thread at a time.
    let fd: Int32
    var reader: SocketLineReader

    convenience init(_ path: String) {
        guard let fd = Client.connectSocket(path) else {
            FileHandle.standardError.write(Data("cannot connect to \(path)\n".utf8))
            exit(1)
        }
        self.init(fd: fd)
    }

    init(fd: Int32) {
        self.fd = fd
        reader = SocketLineReader(fd: fd, capacity: 1 << 20)
    }

    /// A connected socket, or nil.
    static func connectSocket(_ path: String) -> Int32? { try? UnixSocket.connect(path) }

    func write(_ bytes: [UInt8]) {
        var off = 0
        while off < bytes.count {
            let n = bytes[off...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { FileHandle.standardError.write(Data("send failed\n".utf8)); exit(1) }
            off += n
        }
    }

    /// Calls `line` for each complete line until it returns false.
    func readLines(_ line: (UnsafeBufferPointer<UInt8>) -> Bool) {
        if !reader.readLines(line) {
            FileHandle.standardError.write(Data("connection closed\n".utf8))
            exit(1)
        }
    }

    func request(_ line: String) -> JSON {
        write(Array((line + "\n").utf8))
        var out = JSON.null
        readLines { l in
            let v = try! JSONParser().parse(Array(l))
            if v["event"] != nil { return true }
            out = v
            return false
        }
        return out
    }
}

func contains(_ l: UnsafeBufferPointer<UInt8>, _ needle: [UInt8]) -> Bool {
    guard l.count >= needle.count else { return false }
    var i = 0
    while i + needle.count <= l.count {
        if l[i] == needle[0] {
            var j = 1
            while j < needle.count && l[i + j] == needle[j] { j += 1 }
            if j == needle.count { return true }
        }
        i += 1
    }
    return false
}

func model200(_ id: String, _ v: Int) -> String {
    #"{"id":"\#(id)","v":\#(v),"name":"Ada Lovelace","title":"Analyst","bio":"First to publish an algorithm for a machine.","tags":["math","poetry","engines"],"org":{"id":"Org:1","name":"Analytical"}}"#
}

/// Three engines in cluster mode on an in-process log (PROTOCOL §8): random
/// mutations from all of them, entries applied by each in log order.
func clusterReplay(mutations n: Int) -> String {
    var state: UInt64 = 0x2545_F491_4F6C_DD1D
    func next() -> Int {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return Int(truncatingIfNeeded: (z ^ (z >> 31)) >> 1)
    }
    var configuration = EngineConfiguration()
    configuration.internalChecks = false
    var engines: [Engine] = []
    var read: [Int] = []
    var entries: [ClusterEntry] = []
    var hash = ""
    func host(_ i: Int) -> Engine {
        let e = Engine(configuration: configuration)
        e.enableCluster(ClusterSettings(name: "r", host: "h\(i)", origin: "h\(i)", timeout: 5))
        e.clusterEvent(.attached(epoch: "", head: 0))
        for c in 1...2 { e.open(c) }
        return e
    }
    for i in 0..<3 { engines.append(host(i)); read.append(0) }
    func pump() {
        for (i, e) in engines.enumerated() {
            let m = e.takeClusterAppends()
            guard !m.isEmpty else { continue }
            let offset = entries.count + 1
            let h = FNV1a.hash("\(hash)|\(offset)|h\(i)".utf8)
            let prev = hash
            hash = String(h, radix: 16)
            entries.append(ClusterEntry(offset: offset, previousHash: prev, hash: hash, epoch: "e", time: Double(offset),
                                        origin: "h\(i)", mutations: m, streamID: "\(offset)-0"))
        }
        for (i, e) in engines.enumerated() {
            while read[i] < entries.count { e.applyClusterEntry(entries[read[i]]); read[i] += 1 }
            _ = e.takeOutput()
        }
    }
    var sent = 0
    var joined = false
    while sent < n {
        for _ in 0..<(1 + next() % 8) where sent < n {
            let h = next() % engines.count, id = next() % 500, v = next() % 40
            let line: String
            switch next() % 10 {
            case 0...3: line = #"{"op":"update","model":{"id":"E:\#(id)","v":\#(v),"tags":["a","\#(v)"],"next":{"id":"E:\#((id * 7 + 1) % 500)"}}}"#
            case 4: line = #"{"op":"delete","id":"E:\#(id)"}"#
            case 5: line = #"{"op":"update","model":{"id":"E:\#(id)","v":0},"if_unchanged_since":\#(max(0, engines[h].seq - v % 5))}"#
            case 6: line = #"{"op":"update","model":{"id":"T:\#(v)","n":\#(id)},"token":"t\#(id % 300)"}"#
            case 7: line = #"{"op":"update","key":"k\#(id % 50)","model":{"e":{"id":"E:\#(id)"},"v":\#(v)}}"#
            case 8: line = #"{"op":"collection.insert","collection":"L\#(id % 5)","index":0,"items":[{"id":"E:\#(id)"}]}"#
            default: line = #"{"op":"batch","ops":[{"op":"update","model":{"id":"E:\#(id)","w":\#(v)}},{"op":"collection.remove","collection":"L\#(id % 5)","index":0,"count":1}]}"#
            }
            engines[h].handleLine(Array(line.utf8), from: 1 + next() % 2)
            sent += 1
        }
        pump()
        if !joined && sent >= n / 2 {
            joined = true
            // A fourth host starts from host 0's snapshot (encoded and decoded) and follows the log from there.
            let snap = try! ClusterSnapshot.decode(engines[0].clusterSnapshot().encode(), maxDepth: 128)
            let e = host(3)
            try! e.loadClusterSnapshot(snap)
            engines.append(e)
            read.append(snap.offset)
        }
    }
    pump()
    let digests = Set(engines.map { $0.stateDigest() })
    let outcomes = Set(engines.prefix(3).map { $0.clusterOutcomeDigest })
    let seqs = Set(engines.map { $0.seq })
    return "mutations \(n) entries \(entries.count) seq \(seqs.sorted()) digest \(digests.map { String($0, radix: 16) }.sorted()) outcomes \(outcomes.map { String($0, radix: 16) }.sorted())"
}

// MARK: Commands

switch command {
case "cluster-replay":
    print(clusterReplay(mutations: options.count ?? 100_000))

case "codec":
    // A ~1 KB nested document, as in PLATFORM-NOTES.
    var items: [String] = []
    for i in 0..<6 {
        items.append(#"{"id":"Post:\#(i)","title":"Title number \#(i) with some words","likes":\#(i * 17),"score":\#(Double(i) * 1.25),"author":{"id":"Person:\#(i)","name":"Person \#(i)","verified":true}}"#)
    }
    let doc = Array(#"{"id":"Feed:1","kind":"home","updated":"2026-11-22T00:00:00Z","posts":[\#(items.joined(separator: ","))],"cursor":null}"#.utf8)
    let parser = JSONParser()
    let value = try! parser.parse(doc)
    let n = options.count ?? 200_000
    var t = now()
    var sink = 0
    for _ in 0..<n { if case .object(let o) = try! parser.parse(doc) { sink &+= o.count } }
    let parseS = now() - t
    t = now()
    for _ in 0..<n { sink &+= value.encoded().count }
    let encodeS = now() - t
    // The flat tape (issue 19): one reused node array, no tree; then the id looked up by bytes.
    var tape = JSONTape()
    t = now()
    doc.withUnsafeBufferPointer { buf in
        for _ in 0..<n {
            try! tape.parse(buf)
            sink &+= tape.member("id", of: 0, in: buf) ?? 0
        }
    }
    let tapeS = now() - t
    // The worst case of the parser's table of small nested values: a line
    // of 10,000 distinct small objects (a collection's items), each a miss.
    let distinct = Array((#"{"op":"collection.set","collection":"c","items":["# + (0..<10_000).map { #"{"id":"Item:\#($0)","v":\#($0)}"# }.joined(separator: ",") + "]}").utf8)
    let rounds = max(1, n / 1_000)
    t = now()
    for _ in 0..<rounds { if case .object(let o) = try! parser.parse(distinct) { sink &+= o.count } }
    let distinctS = now() - t
    // And of 2,000 distinct objects past the table's 128 bytes (each scanned to its limit when looked up).
    let large = Array((#"{"op":"collection.set","collection":"c","items":["# + (0..<2_000).map { #"{"id":"Item:\#($0)","title":"An item whose encoding is longer than the table keeps","body":"\#(String(repeating: "x", count: 60))","v":\#($0)}"# }.joined(separator: ",") + "]}").utf8)
    t = now()
    for _ in 0..<rounds { if case .object(let o) = try! parser.parse(large) { sink &+= o.count } }
    let largeS = now() - t
    let mb = Double(doc.count * n) / 1e6
    print("document \(doc.count) B, \(n) iterations (sink \(sink % 7))")
    print(String(format: "distinct: %.1f MB/s  (%.3f µs per small object, a line of 10,000 distinct ones)", Double(distinct.count * rounds) / 1e6 / distinctS, distinctS / Double(rounds * 10_000) * 1e6))
    print(String(format: "large distinct: %.1f MB/s  (%.3f µs per object of ~180 B, a line of 2,000 distinct ones)", Double(large.count * rounds) / 1e6 / largeS, largeS / Double(rounds * 2_000) * 1e6))
    print(String(format: "parse:  %.1f MB/s  (%.2f µs per document)", mb / parseS, parseS / Double(n) * 1e6))
    print(String(format: "tape:   %.1f MB/s  (%.2f µs per document, %d nodes, the id found by bytes)", mb / tapeS, tapeS / Double(n) * 1e6, tape.nodes.count))
    print(String(format: "encode: %.1f MB/s  (%.2f µs per document)", mb / encodeS, encodeS / Double(n) * 1e6))

case "core":
    // The engine on this thread: the sequencer's work per update, without the
    // loop, the hand-offs or the kernel. Same payloads as concord-bench.
    let n = options.count ?? 200_000
    let subs = options.subs ?? 1
    let kind = options.kind ?? "key"
    var configuration = EngineConfiguration()
    configuration.outputSoftBytes = 0
    configuration.internalChecks = false
    let engine = Engine(configuration: configuration)
    func entity(_ i: Int, _ v: Int) -> String {
        #"{"id":"E:\#(i)","t":\#(v),"name":"Ada Lovelace","title":"Analyst","bio":"First to publish an algorithm intended for a machine; notes on the Analytical Engine.","tags":["math","poetry"],"v":\#(v)}"#
    }
    engine.open(0)
    if kind == "rename" {
        // The query workload's propagation: 10,000 posts by 100 authors; each
        // update renames an author, whose 100 posts are re-materialized.
        for i in 0..<10_000 {
            engine.handleLine(Array(#"{"op":"update","model":{"id":"Post:\#(i)","date":\#(i),"title":"Post number \#(i)","author":{"id":"Person:\#(i % 100)","name":"Person \#(i % 100)"}}}"#.utf8), from: 0)
        }
        _ = engine.takeOutput()
        let lines = (0..<n).map { k in Array(#"{"op":"update","model":{"id":"Person:\#(k % 100)","name":"Person \#(k % 100) renamed \#(k)"}}"#.utf8) }
        let t = now()
        measuredLoop(engine, lines)
        let s = now() - t
        print(String(format: "core: %d renames, each re-materializing 100 posts: %.2f µs per rename (%.3f µs per post)", n, s / Double(n) * 1e6, s / Double(n) * 1e4))
        break
    }
    if kind == "views" {
        // concord-bench's query memory row: 100,000 posts by 1,000 authors,
        // then one view per author ("the 20 newest posts of author A", ~100
        // members each); jemalloc bytes per view and per member.
        for i in 0..<100_000 {
            engine.handleLine(Array(#"{"op":"update","model":{"id":"Post:\#(i)","date":\#(i),"title":"Post number \#(i)","author":{"id":"Person:\#(i % 1000)","name":"Person \#(i % 1000)"}}}"#.utf8), from: 0)
        }
        _ = engine.takeOutput()
        engine.open(1)
        let before = jemallocAllocated()
        let t = now()
        for a in 0..<1000 {
            engine.handleLine(Array(#"{"op":"subscribe","sub":"q\#(a)","query":{"type":"Post","where":{"path":"author.id","eq":"\#(ProcessInfo.processInfo.environment["VIEWS_EMPTY"] != nil ? "Nobody" : "Person"):\#(a)"},"order":[{"path":"date","desc":true}],"limit":20}}"#.utf8), from: 1)
            if a % 100 == 99 { _ = engine.takeOutput() }
            if a == 0 {
                _ = engine.takeOutput()
                let first = jemallocAllocated()
                print(String(format: "views: the first view (the type's entity indexes, built once) %.0f bytes, %.1f per entity", Double(first - before), Double(first - before) / 100_000))
            }
        }
        _ = engine.takeOutput()
        let built = now() - t
        let after = jemallocAllocated()
        print(String(format: "views: 1,000 views of 100 members built in %.2f s; %.0f jemalloc bytes per view, %.1f per member (allocated %d → %d)",
                     built, Double(after - before) / 1000, Double(after - before) / 100_000, before, after))
        break
    }
    if kind == "posts" || kind == "range" || kind == "pages" || kind == "windows" {
        let pages = options.subs ?? 50
        // concord-bench's live-query writes with no query (its "0 subs" row):
        // 100,000 posts by 1,000 authors; 5 in 10 updates merge a new date,
        // 3 in 10 merge another author, 2 in 10 rename an author (100 posts each).
        for i in 0..<100_000 {
            engine.handleLine(Array(#"{"op":"update","model":{"id":"Post:\#(i)","date":\#(i),"title":"Post number \#(i)","author":{"id":"Person:\#(i % 1000)","name":"Person \#(i % 1000)"}}}"#.utf8), from: 0)
        }
        if kind == "range" {
            // concord-bench's range-predicate row: 1,000 views, one subscriber
            // each, `date ≥ a and date < b` over spans of 100 posts.
            engine.open(1)
            for v in 0..<1000 {
                engine.handleLine(Array(#"{"op":"subscribe","sub":"q\#(v)","query":{"type":"Post","where":{"all":[{"path":"date","gte":\#(v * 100)},{"path":"date","lt":\#((v + 1) * 100)}]},"order":[{"path":"date","desc":true}],"limit":20}}"#.utf8), from: 1)
            }
        }
        if kind == "windows" {
            // concord-bench's "1k subs" live-query row: 1,000 per-author
            // windows of 20 (newest first), one subscriber each.
            engine.open(1)
            for a in 0..<1000 {
                engine.handleLine(Array(#"{"op":"subscribe","sub":"q\#(a)","query":{"type":"Post","where":{"path":"author.id","eq":"Person:\#(a)"},"order":[{"path":"date","desc":true}],"limit":20}}"#.utf8), from: 1)
            }
        }
        if kind == "pages" {
            // 50 pages (--subs) of 20 of one list (the newest posts first), one
            // subscriber each: definitions that differ only in offset.
            engine.open(1)
            let t = now()
            for v in 0..<pages {
                engine.handleLine(Array(#"{"op":"subscribe","sub":"p\#(v)","query":{"type":"Post","order":[{"path":"date","desc":true}],"offset":\#(v * 20),"limit":20}}"#.utf8), from: 1)
            }
            let built = now() - t
            engine.handleLine(Array(#"{"op":"stats"}"#.utf8), from: 1)
            var text = ""
            for (_, chunks) in engine.takeOutput() { for ch in chunks { text += String(decoding: UnsafeRawBufferPointer(start: ch.base, count: ch.count), as: UTF8.self) } }
            if let r = text.range(of: "\"queries\":{") {
                let rest = text[r.upperBound...]
                print("pages: \(pages) subscribed in \(String(format: "%.2f", built)) s; queries {\(rest.prefix { $0 != "}" })}")
            }
        }
        _ = engine.takeOutput()
        var rng = SplitMix(seed: 7)
        // MIX=date|author|rename: that kind of update only (to measure one
        // part of the mix; the same random sequence otherwise).
        let only = ProcessInfo.processInfo.environment["MIX"]
        let lines = (0..<n).map { k -> [UInt8] in
            var r = Int(rng.next() % 10)
            let p = Int(rng.next() % 100_000), a = Int(rng.next() % 1000)
            switch only {
            case "date": r = 0
            case "author": r = 5
            case "rename": r = 8
            default: break
            }
            if r < 5 { return Array(#"{"op":"update","mode":"merge","model":{"id":"Post:\#(p)","date":\#(100_000 + k)}}"#.utf8) }
            if r < 8 { return Array(#"{"op":"update","mode":"merge","model":{"id":"Post:\#(p)","author":{"id":"Person:\#(a)"}}}"#.utf8) }
            return Array(#"{"op":"update","model":{"id":"Person:\#(a)","name":"Person \#(a) renamed \#(k)"}}"#.utf8)
        }
        let t = now()
        measuredLoop(engine, lines)
        let s = now() - t
        let what = kind == "range" ? "1,000 range views" : (kind == "pages" ? "\(pages) pages of one list" : (kind == "windows" ? "1,000 per-author windows" : "no query"))
        print(String(format: "core: %d updates of the live-query mix, %@: %.2f µs per update", n, what, s / Double(n) * 1e6))
        break
    }
    for i in 0..<100 { engine.handleLine(Array(#"{"op":"update","key":"k\#(i)","model":\#(entity(i, 0))}"#.utf8), from: 0) }
    if kind != "none" {
        for c in 1...max(subs, 1) {
            engine.open(c)
            for i in 0..<100 {
                // `models`: each connection's trees its own (no view shared).
                let line = kind == "model" ? #"{"op":"subscribe","sub":"m\#(i)","model":\#(entity(i, 0))}"#
                         : kind == "models" ? #"{"op":"subscribe","sub":"m\#(i)","model":{"viewer":\#(c),"item":\#(entity(i, 0))}}"#
                                           : #"{"op":"subscribe","sub":"k\#(i)","key":"k\#(i)"}"#
                engine.handleLine(Array(line.utf8), from: c)
            }
        }
    }
    _ = engine.takeOutput()
    let lines = (0..<n).map { k in Array(#"{"op":"update","model":\#(entity(k % 100, k + 1))}"#.utf8) }
    var bytes = 0
    let t = now()
    for l in lines {
        engine.handleLine(l, from: 0)
        for (_, chunks) in engine.takeOutput() { for ch in chunks { bytes &+= ch.count } }
    }
    let s = now() - t
    print(String(format: "core: %d updates, %@ × %d subscriber connection(s): %.2f µs per update (%.0f updates/s), %ld bytes out",
                 n, kind, kind == "none" ? 0 : subs, s / Double(n) * 1e6, Double(n) / s, bytes))

case "pipeline":
    let n = options.count ?? 200_000
    let c = Client(socketPath)
    _ = c.request(#"{"op":"hello"}"#)
    let lines = (0..<n).map { i -> [UInt8] in
        let m = model200("Person:\(i % 1000)", i)
        return Array((#"{"op":"update","model":\#(m)}"# + "\n").utf8)
    }
    let t = now()
    let writer = Thread {
        var chunk: [UInt8] = []
        for l in lines {
            chunk += l
            if chunk.count > 1 << 16 { c.write(chunk); chunk.removeAll(keepingCapacity: true) }
        }
        c.write(chunk)
    }
    writer.start()
    var got = 0
    c.readLines { _ in
        got += 1
        return got < n
    }
    let s = now() - t
    print(String(format: "pipelined updates: %d in %.2f s = %.0f updates/s", n, s, Double(n) / s))

case "fanout":
    let subs = options.subs ?? 100
    let n = options.count ?? 20_000
    let kind = options.kind ?? "key"
    let readers = (0..<subs).map { _ in Client(socketPath) }
    for (i, r) in readers.enumerated() {
        // `model`: every reader the same tree (one shared view); `models`: trees of their own.
        let body = kind == "key" ? #""key":"fan""# : (kind == "ids" ? #""ids":["Person:1"]"#
                   : kind == "models" ? #""model":{"viewer":\#(i),"item":\#(model200("Person:1", -1))}"# : #""model":\#(model200("Person:1", -1))"#)
        let resp = r.request(#"{"op":"subscribe","sub":"s\#(i)",\#(body)}"#)
        if resp["ok"] != true { print("subscribe failed: \(resp.compactString)"); exit(1) }
    }
    let writer = Client(socketPath)
    let needle = Array(#""seq":"#.utf8)
    let group = DispatchGroup()
    let t = now()
    for r in readers {
        group.enter()
        Thread {
            var count = 0
            r.readLines { l in
                if contains(l, needle) { count += 1 }
                return count < n
            }
            group.leave()
        }.start()
    }
    Thread {
        var chunk: [UInt8] = []
        for i in 0..<n {
            let line = kind == "key"
                ? #"{"op":"update","key":"fan","model":\#(model200("Person:1", i))}"#
                : #"{"op":"update","model":\#(model200("Person:1", i))}"#
            chunk += Array((line + "\n").utf8)
            if chunk.count > 1 << 16 { writer.write(chunk); chunk.removeAll(keepingCapacity: true) }
        }
        writer.write(chunk)
    }.start()
    group.wait()
    let s = now() - t
    print(String(format: "fan-out (%@ views): %d subscribers × %d updates in %.2f s = %.0f updates/s, %.0f delivered events/s",
                 kind, subs, n, s, Double(n) / s, Double(subs * n) / s))

case "subs":
    let n = options.count ?? 100_000
    let perConn = 50_000
    let probe = Client(socketPath)
    func allocated() -> Int { probe.request(#"{"op":"stats"}"#)["memory"]!["allocated"]!.numberValue!.intValue! }
    let conns = (0..<((n + perConn - 1) / perConn)).map { _ in Client(socketPath) }
    let before = allocated()
    let shared = options.shared == "yes"
    for (ci, c) in conns.enumerated() {
        let count = min(perConn, n - ci * perConn)
        // In rounds of 5,000 with the replies read between them: a client
        // that writes without reading is paused by the server (flow control).
        var i = 0
        while i < count {
            let m = min(5000, count - i)
            var chunk: [UInt8] = []
            for j in i..<(i + m) {
                let key = shared ? "k" : "k\(ci * perConn + j)"
                chunk += Array((#"{"op":"subscribe","sub":"s\#(j)","key":"\#(key)"}"# + "\n").utf8)
            }
            c.write(chunk)
            var got = 0
            c.readLines { _ in got += 1; return got < m }
            i += m
        }
    }
    let after = allocated()
    print(String(format: "%d key subscriptions (%@ keys): %.1f jemalloc bytes each (allocated %d → %d)",
                 n, shared ? "one shared" : "distinct", Double(after - before) / Double(n), before, after))

case "collections":
    // Update one item of an N-item collection; head insert/remove churn with S subscribers.
    let size = options.count ?? 100_000
    let subs = options.subs ?? 10
    let ops = options.ops
    let name = "bench\(size)-\(Int(now() * 1000) % 1_000_000)"
    let w = Client(socketPath)
    var chunk = ""
    for i in 0..<size { chunk += (i > 0 ? "," : "") + #"{"id":"Item:\#(name):\#(i)","n":\#(i),"title":"item \#(i)"}"# }
    var t = now()
    let setResp = w.request(#"{"op":"collection.set","collection":"\#(name)","items":[\#(chunk)]}"#)
    print(String(format: "collection.set of %d items: %.1f ms (%@)", size, (now() - t) * 1000, setResp["ok"] == true ? "ok" : setResp.compactString))
    let readers = (0..<subs).map { _ in Client(socketPath) }
    for (i, r) in readers.enumerated() { _ = r.request(#"{"op":"subscribe","sub":"c\#(i)","collection":"\#(name)"}"#) }
    // One item update: event size and round trip (update sent → event read by a subscriber).
    var eventBytes = 0
    var total = 0.0
    let rounds = 50
    for k in 0..<rounds {
        t = now()
        w.write(Array((#"{"op":"update","model":{"id":"Item:\#(name):\#(size / 2)","n":-\#(k),"title":"changed"}}"# + "\n").utf8))
        readers[0].readLines { l in eventBytes = l.count + 1; return false }
        total += now() - t
        for r in readers.dropFirst() { r.readLines { _ in false } }
        _ = w.request(#"{"op":"ping"}"#)
    }
    print(String(format: "one item update in %d: event %d bytes, %.0f µs update→event (mean of %d)", size, eventBytes, total / Double(rounds) * 1e6, rounds))
    // Head insert then head remove, pipelined.
    for (label, make) in [("head insert", { (k: Int) in #"{"op":"collection.insert","collection":"\#(name)","index":0,"items":[{"id":"Item:\#(name):h\#(k)","n":\#(k)}]}"# }),
                          ("head remove", { (_: Int) in #"{"op":"collection.remove","collection":"\#(name)","index":0}"# })] {
        let group = DispatchGroup()
        t = now()
        for r in readers {
            group.enter()
            Thread {
                var got = 0
                r.readLines { _ in got += 1; return got < ops }
                group.leave()
            }.start()
        }
        var buf: [UInt8] = []
        for k in 0..<ops { buf += Array((make(k) + "\n").utf8) }
        w.write(buf)
        var acks = 0
        w.readLines { _ in acks += 1; return acks < ops }
        group.wait()
        let s = now() - t
        print(String(format: "%@ on %d items, %d subscribers: %.0f ops/s", label, size, subs, Double(ops) / s))
    }
    _ = w.request(#"{"op":"collection.delete","collection":"\#(name)"}"#)

case "backend":
    // put / write_batch / get ops/s through the C ABI, 100k keys, 200-byte values.
    let spec = options.cache
    let n = options.count ?? 100_000
    let dir = NSTemporaryDirectory() + "concord-load-\(getpid())"
    try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    let config = options.cacheConfig ?? (spec == "sqlite" ? #"{"path":"\#(dir)/b.sqlite","max_bytes":0}"# : #"{"max_bytes":0}"#)
    let backend = try! Backend.open(spec: spec, configJSON: config, logger: Logger(label: "load"))
    let value = [UInt8](repeating: 0x61, count: 200)
    let keys = (0..<n).map { Array("e:Person:\($0)".utf8) }
    var t = now()
    let singles = min(n, spec == "sqlite" ? 20000 : n)
    for i in 0..<singles { try! backend.put(keys[i], value) }
    let putS = now() - t
    t = now()
    var i = 0
    while i < n {
        let end = min(i + 1000, n)
        try! backend.writeBatch((i..<end).map { (keys[$0], value) })
        i = end
    }
    let batchS = now() - t
    t = now()
    var found = 0
    for k in keys { if try! backend.get(k) != nil { found += 1 } }
    let getS = now() - t
    print(String(format: "%@: put %.0f ops/s (single), write_batch %.0f records/s (1000 per batch), get %.0f ops/s (%d found)",
                 spec, Double(singles) / putS, Double(n) / batchS, Double(n) / getS, found))
    print("stats: \(backend.stats().compactString)")
    backend.close()
    try? FileManager.default.removeItem(atPath: dir)

case "populate":
    // Writes N entities (and one document holding the first) pipelined, for restart timing.
    let n = options.count ?? 1_000_000
    let c = Client(socketPath)
    let t = now()
    let writer = Thread {
        var buf: [UInt8] = []
        for i in 0..<n {
            buf += Array((#"{"op":"update","model":{"id":"Person:\#(i)","name":"Person \#(i)","org":{"id":"Org:\#(i % 100)","name":"Org \#(i % 100)"}}}"# + "\n").utf8)
            if buf.count > 1 << 16 { c.write(buf); buf.removeAll(keepingCapacity: true) }
        }
        c.write(buf)
    }
    writer.start()
    var got = 0
    c.readLines { _ in got += 1; return got < n }
    print(String(format: "populated %d entities in %.1f s", n, now() - t))

case "first-get":
    // Waits for the socket, then times the first get (run right after starting the server).
    let t = now()
    var c: Client? = nil
    while c == nil {
        if let fd = Client.connectSocket(socketPath) { c = Client(fd: fd) } else { usleep(1000) }
    }
    let listening = now() - t
    let r = c!.request(#"{"op":"get","id":"\#(options.id)"}"#)
    print(String(format: "socket up after %.0f ms, first get answered after %.0f ms: %@", listening * 1000, (now() - t) * 1000, r["model"]?.compactString ?? "?"))

default:
    break  // validate() admits only the commands above
}

/// A small deterministic generator (the same lines on every run).
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The timed part of `core --kind rename|posts`, apart so that callgrind can
/// count it alone (`--toggle-collect='*measuredLoop*'`).
@inline(never)
func measuredLoop(_ engine: Engine, _ lines: [[UInt8]]) {
    for l in lines {
        engine.handleLine(l, from: 0)
        _ = engine.takeOutput()
    }
}

/// jemalloc's `stats.allocated`, after refreshing its epoch.
func jemallocAllocated() -> Int {
    _ = CJemalloc_refresh()
    var v = 0
    _ = CJemalloc_read_size("stats.allocated", &v)
    return v
}
