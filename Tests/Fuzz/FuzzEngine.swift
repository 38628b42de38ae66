// libFuzzer target: the engine. The input is a program — requests on four
// connections over a few entities, documents and one collection, with slow
// readers (small soft output limit, so coalescing happens) — run through a
// single-threaded Engine. Checked after the program:
// - every output line parses; each connection gets exactly one response per
//   request, in order (rids);
// - per subscription, `seq` never decreases, and model/key/collection views
//   get at most one event per seq;
// - after `resume` of everything and a `ping`, every key view's last value
//   equals `get`, and every collection and query copy (subscribe items +
//   every change list applied) equals `get` (queries: and its count).
import ConcordCore
import ConcordJSON
import ConcordTestSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

struct Cursor {
    let bytes: UnsafeBufferPointer<UInt8>
    var i = 0
    mutating func next() -> Int? {
        guard i < bytes.count else { return nil }
        defer { i += 1 }
        return Int(bytes[i])
    }
    mutating func small(_ n: Int) -> Int { (next() ?? 0) % n }
}

final class Peer {
    let id: Int
    let flow = ConnectionFlow()
    var unread: [UInt8] = []
    var raw: [UInt8] = []
    var sentRids: [Int] = []
    var gotRids: [Int] = []
    /// Subscription name → kind, last seq, last key value, collection copy.
    var kinds: [String: String] = [:]
    var lastSeq: [String: Int] = [:]
    var keyValue: [String: JSON] = [:]
    var list: [String: [JSON]] = [:]
    var count: [String: Int] = [:]
    var keyOf: [String: String] = [:]
    var pendingUnsubscribe: [Int: String] = [:]
    var pendingSubscribe: [Int: (name: String, kind: String, key: String)] = [:]
    init(id: Int) { self.id = id }
}

let parser = JSONParser(maxDepth: 100_000)

func fail(_ s: String) -> Never { fatalError(s) }

/// Live queries over the fuzzed entities: windows, offsets, nested sort members, an unindexed predicate.
let fuzzQueries = [
    #"{"type":"P","order":[{"path":"n"}],"limit":2}"#,
    #"{"type":"P","where":{"path":"q.id","eq":"Q:1"},"order":[{"path":"n","desc":true}],"offset":1,"limit":2}"#,
    #"{"type":"P","order":[{"path":"q.m"},{"path":"x"}],"offset":1}"#,
    #"{"type":"P","where":{"any":[{"path":"n","gt":3},{"path":"x","exists":true}]}}"#,
    #"{"type":"Q","where":{"path":"m","in":[0,1,2,3]},"limit":1}"#,
    // Found through the range index.
    #"{"type":"P","where":{"all":[{"path":"n","gte":1},{"path":"n","lt":4}]},"order":[{"path":"n"}],"limit":2}"#,
    #"{"type":"P","where":{"path":"q.m","lte":2}}"#,
    // Other pages of the lists above (they share one tree of matches).
    #"{"type":"P","order":[{"path":"n"}],"offset":1,"limit":3}"#,
    #"{"type":"P","where":{"path":"q.id","eq":"Q:1"},"order":[{"path":"n","desc":true}]}"#,
]

func deliver(_ engine: Engine, _ peers: [Peer]) {
    for (id, chunks) in engine.takeOutput() {
        let p = peers[id - 1]
        for c in chunks { p.unread.append(contentsOf: UnsafeRawBufferPointer(start: c.base, count: c.count)) }
    }
}

/// The peer's socket takes everything; like the loop, report a drained episode.
func read(_ engine: Engine, _ peers: [Peer], _ p: Peer) {
    while !p.unread.isEmpty {
        p.flow.unsent.subtract(p.unread.count, ordering: .relaxed)
        p.raw.append(contentsOf: p.unread)
        p.unread = []
        consume(p)
        let episode = p.flow.coalescing.load(ordering: .relaxed)
        if episode != 0 {
            engine.outputDrained(p.id, episode: episode)
            deliver(engine, peers)
        }
    }
}

func consume(_ p: Peer) {
    while let nl = p.raw.firstIndex(of: 0x0A) {
        let line = Array(p.raw[..<nl])
        p.raw.removeSubrange(...nl)
        guard let v = try? parser.parse(line) else { fail("unparsable output: \(String(decoding: line, as: UTF8.self))") }
        if getenv("FUZZ_TRACE") != nil { print("  -> \(p.id): \(String(decoding: line, as: UTF8.self))") }
        if let sub = v["sub"]?.stringValue, v["event"] != nil {
            let seq = v["seq"]?.numberValue?.intValue ?? -1
            let kind = p.kinds[sub] ?? "?"
            let last = p.lastSeq[sub] ?? -1
            if seq < last { fail("\(sub): seq \(seq) after \(last)") }
            if seq == last && ["model", "key", "collection", "query"].contains(kind) { fail("\(sub): two events with seq \(seq)") }
            p.lastSeq[sub] = seq
            switch v["event"]?.stringValue {
            case "delete":
                p.kinds[sub] = nil
                p.keyValue[sub] = nil
                p.list[sub] = nil
            case "update" where kind == "key":
                p.keyValue[sub] = v["model"] ?? .null
            case "collection", "query":
                var l = p.list[sub] ?? []
                do { try applyChanges(&l, v) } catch { fail("\(sub): \(error)") }
                p.list[sub] = l
                if let n = v["count"]?.numberValue?.intValue { p.count[sub] = n }
            default:
                break
            }
            continue
        }
        guard let rid = v["rid"]?.numberValue?.intValue else { fail("response without an integer rid: \(v.compactString)") }
        p.gotRids.append(rid)
        if let name = p.pendingUnsubscribe.removeValue(forKey: rid), v["ok"] == true {
            p.kinds[name] = nil
            p.keyValue[name] = nil
            p.list[name] = nil
        }
        if let (name, kind, key) = p.pendingSubscribe.removeValue(forKey: rid), v["ok"] == true {
            p.kinds[name] = kind
            p.keyOf[name] = key
            p.lastSeq[name] = v["seq"]?.numberValue?.intValue ?? 0
            if kind == "key" { p.keyValue[name] = v["model"] ?? .null }
            if kind == "collection" || kind == "query" { p.list[name] = v["items"]?.arrayValue ?? [] }
            if kind == "query" { p.count[name] = v["count"]?.numberValue?.intValue ?? -1 }
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    var config = EngineConfiguration()
    config.outputSoftBytes = 600
    config.internalChecks = true
    let engine = Engine(configuration: config)
    let now = Mutex(0.0)
    engine.clock = { now.withLock { $0 } }
    let peers = (1...4).map { Peer(id: $0) }
    for p in peers { engine.open(p.id, flow: p.flow) }
    var cur = Cursor(bytes: UnsafeBufferPointer(start: data, count: size))
    // Cluster mode (PROTOCOL §8) when the first byte is odd: mutations go to
    // an in-process log, applied when the program says; appends may fail,
    // as indeterminate (applied later all the same) or not (dropped); the
    // link may detach. Every ordering check below holds all the same.
    let clustered = size > 0 && data[0] & 1 == 1
    let trace = getenv("FUZZ_TRACE") != nil
    if trace { setvbuf(stdout, nil, _IONBF, 0) }
    var log: [ClusterEntry] = []
    var applied = 0
    var hash = ""
    var hashes = 0
    if clustered {
        engine.enableCluster(ClusterSettings(name: "f", host: "f", origin: "f", timeout: 5))
        engine.clusterEvent(.attached(epoch: "", head: 0))
    }
    func appendTaken(_ m: [(ref: Int, line: [UInt8])]) {
        guard !m.isEmpty else { return }
        let prev = hash
        hashes += 1
        hash = "h\(hashes)"
        log.append(ClusterEntry(offset: log.count + 1, previousHash: prev, hash: hash, epoch: "e", time: Double(log.count),
                                origin: "f", mutations: m, streamID: "\(log.count + 1)-0"))
    }
    func pumpLog(apply: Bool = true) {
        guard clustered else { return }
        appendTaken(engine.takeClusterAppends())
        if engine.takeClusterHeadWanted() { engine.clusterEvent(.head(log.count)) }
        // The host stopped following a log that lost entries: rebuild from the log's start.
        if engine.takeClusterResyncWanted() {
            if trace { print("resync") }
            do { try engine.beginClusterResync(from: nil) } catch { fail("resync: \(error)") }
            applied = 0
            appendTaken(engine.takeClusterAppends())
        }
        while apply && applied < log.count {
            engine.applyClusterEntry(log[applied])
            applied += 1
            if engine.takeClusterHeadWanted() { engine.clusterEvent(.head(log.count)) }
            appendTaken(engine.takeClusterAppends())
        }
        deliver(engine, peers)
    }
    var rid = 0
    func send(_ p: Peer, _ body: String) {
        rid += 1
        p.sentRids.append(rid)
        let line = "{\"rid\":\(rid)," + body.dropFirst()
        if trace { print("send \(p.id): \(line)") }
        // Every other line comes decoded, as a long line does from the parse thread.
        if rid % 2 == 0 {
            engine.handle(Engine.parse(Array(line.utf8), parser: engine.lineParser, decodeWith: config.idKey), from: p.id)
        } else {
            engine.handleLine(Array(line.utf8), from: p.id)
        }
        deliver(engine, peers)
    }
    var steps = 0
    while let op = cur.next(), steps < 400 {
        steps += 1
        let p = peers[cur.small(4)]
        let a = cur.small(4), b = cur.small(8), name = "s\(cur.small(4))"
        switch op % 16 {
        case 0:
            // Sometimes conditional (a conflict or bad_request changes nothing), sometimes with a token (retries answered).
            let extra = b % 3 == 0 ? #","if_unchanged_since":\#(engine.seq - a)"# : (b % 3 == 1 ? #","token":"t\#(a)""# : "")
            send(p, #"{"op":"update"\#(extra),"model":{"id":"P:\#(a)","n":\#(b),"q":{"id":"Q:\#(b % 3)","m":\#(a)}}}"#)
        case 1: send(p, #"{"op":"update","key":"d\#(a % 2)","model":{"id":"D:\#(a % 2)","p":{"id":"P:\#(b % 4)"},"v":\#(b)}}"#)
        case 2: send(p, #"{"op":"delete","id":"\#(b % 2 == 0 ? "P" : "Q"):\#(a)"}"#)
        case 3:
            let kinds = ["key", "model", "ids", "collection", "feed", "query", "query"]
            let kind = kinds[b % kinds.count]
            let target: String
            switch kind {
            case "key": target = #""key":"d\#(a % 2)""#
            case "model": target = #""model":{"id":"P:\#(a)","q":{"id":"Q:1"}},"refresh":\#(b % 2 == 0)"#
            case "ids": target = #""ids":["P:\#(a)","Q:\#(a % 3)"]"#
            case "collection": target = #""collection":"c0""#
            case "query": target = #""query":\#(fuzzQueries[(a + 4 * b) % fuzzQueries.count])"#
            default: target = #""feed":{}"#
            }
            p.pendingSubscribe[rid + 1] = (name, kind, kind == "query" ? fuzzQueries[(a + 4 * b) % fuzzQueries.count] : "d\(a % 2)")
            send(p, #"{"op":"subscribe","sub":"\#(name)",\#(target)}"#)
        case 4:
            p.pendingUnsubscribe[rid + 1] = name
            send(p, #"{"op":"unsubscribe","sub":"\#(name)"}"#)
        case 5: send(p, #"{"op":"pause","sub":"\#(name)"}"#)
        case 6: send(p, #"{"op":"resume","sub":"\#(name)"}"#)
        case 7: send(p, #"{"op":"collection.insert","collection":"c0","index":\#(b % 3),"items":[{"id":"P:\#(a)","n":\#(b)}]}"#)
        case 8: send(p, #"{"op":"collection.remove","collection":"c0","index":\#(a % 3),"count":1}"#)
        case 9: send(p, #"{"op":"batch","if_unchanged_since":\#(max(0, engine.seq - b)),"ops":[{"op":"update","model":{"id":"Q:\#(a % 3)","m":\#(b)}},{"op":"collection.remove","collection":"c0","ids":["P:\#(b % 4)"]}]}"#)
        case 10: send(p, b % 3 == 0 ? #"{"op":"sync"}"# : (b % 3 == 1 ? #"{"op":"ping","min_seq":\#(engine.seq)}"# : #"{"op":"ping"}"#))
        case 11:
            if b == 0 { send(p, #"{"op":"clear"}"#) }
            if clustered {
                let taken = engine.takeClusterAppends()
                switch b {
                case 1, 2:
                    // Lost answers: indeterminate — and in the log all the same.
                    engine.clusterEvent(.appendFailed(refs: taken.map(\.ref), indeterminate: true, reason: "fuzz"))
                    appendTaken(taken)
                case 3:
                    engine.clusterEvent(.appendFailed(refs: taken.map(\.ref), indeterminate: false, reason: "fuzz"))
                case 4:
                    appendTaken(taken)
                    engine.clusterEvent(.detached(reason: "fuzz"))
                case 5 where log.count > applied - 2 && applied >= 2:
                    if trace { print("rollback to \(applied - 2)") }
                    // The log loses its last entries (an older copy restored) and grows again.
                    let keep = applied - 2
                    log.removeLast(log.count - keep)
                    hash = log.last?.hash ?? ""
                    appendTaken(taken)
                    if log.count == keep { appendTaken([(-1, Array(#"{"op":"update","model":{"id":"P:9","n":9}}"#.utf8))]) }
                    applied = keep
                default:
                    appendTaken(taken)
                    engine.clusterEvent(.attached(epoch: "e", head: log.count))
                }
                deliver(engine, peers)
            }
        case 12: send(p, #"{"op":"update","model":{"id":"P:\#(a)","n":\#(b)},"force":true,"context":\#(b)}"#)
        case 13: send(p, #"{"op":"update","mode":"merge","model":{"id":"P:\#(a)","x":\#(b)}}"#)
        case 14: read(engine, peers, p); pumpLog(apply: b % 2 == 0)
        case 15: read(engine, peers, p)
        default: break
        }
    }
    // The log is reachable again and applied; what it lost is answered
    // (indeterminate) after the cluster timeout; everyone reads; every
    // subscription is resumed; a barrier.
    if clustered { engine.clusterEvent(.attached(epoch: "e", head: log.count)) }
    pumpLog()
    if clustered {
        now.withLock { $0 = 10 }
        engine.expireClusterWaits()
        // Until nothing moves: an answer lets a connection's next lines go to the log, and so on.
        for _ in 0..<8 {
            pumpLog()
            for p in peers { read(engine, peers, p) }
        }
    }
    for p in peers { read(engine, peers, p) }
    for p in peers {
        for name in p.kinds.keys.sorted() { send(p, #"{"op":"resume","sub":"\#(name)"}"#) }
        send(p, #"{"op":"ping"}"#)
        pumpLog()
        read(engine, peers, p)
    }
    for p in peers where p.gotRids != p.sentRids {
        fail("connection \(p.id): responses \(p.gotRids) for requests \(p.sentRids)")
    }
    // Views against `get`, through a fresh connection.
    engine.open(5)
    for p in peers {
        for (name, kind) in p.kinds where kind == "key" || kind == "collection" || kind == "query" {
            let q = kind == "key" ? #"{"op":"get","key":"\#(p.keyOf[name] ?? "")"}"#
                : kind == "query" ? #"{"op":"get","query":\#(p.keyOf[name] ?? "")}"# : #"{"op":"get","collection":"c0"}"#
            var answer: JSON = .null
            engine.handleLine(Array(q.utf8), from: 5)
            for (_, chunks) in engine.takeOutput() {
                var bytes: [UInt8] = []
                for c in chunks { bytes.append(contentsOf: UnsafeRawBufferPointer(start: c.base, count: c.count)) }
                if let nl = bytes.firstIndex(of: 0x0A), let v = try? parser.parse(Array(bytes[..<nl])) { answer = v }
            }
            if kind == "key", answer["model"] != (p.keyValue[name] ?? .null) {
                fail("connection \(p.id) \(name): key view \(p.keyValue[name]?.compactString ?? "nil") but get says \(answer["model"]?.compactString ?? "nil")")
            }
            if kind == "collection", (answer["items"]?.arrayValue ?? []) != (p.list[name] ?? []) {
                fail("connection \(p.id) \(name): collection copy differs from get")
            }
            if kind == "query", (answer["items"]?.arrayValue ?? []) != (p.list[name] ?? []) || answer["count"]?.numberValue?.intValue != p.count[name] {
                fail("connection \(p.id) \(name): query copy \((p.list[name] ?? []).map(\.compactString)) (count \(p.count[name] ?? -1)) but get says \(answer.compactString)")
            }
        }
    }
    return 0
}
