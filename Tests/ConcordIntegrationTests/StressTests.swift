import ConcordJSON
import ConcordTestSupport
import ConcordTestServer
import Foundation
import Testing

/// Several connections issue random operation sequences at once against a
/// server with worker threads; afterwards every view must equal `get`, and
/// every subscription's events must be in `seq` order with nothing repeated.
///
/// `CONCORD_SOAK=1` runs many more operations and seeds (see README, "Soak").
@Suite(.serialized)
struct StressTests {
    static var soak: Bool { ProcessInfo.processInfo.environment["CONCORD_SOAK"] != nil }

    /// The worker threads a seed's server runs with: both configurations are covered.
    static func threads(_ seed: UInt64) -> String { seed % 2 == 0 ? "2" : "1" }

    /// `--parallel-threshold 1` sends every step through the worker pool, so
    /// the parallel paths are the ones under test; odd seeds run `--threads 1`
    /// (everything inline on the sequencer), even seeds `--threads 2`.
    @Test(arguments: soak ? Array(1...8) : [1, 2])
    func randomConcurrentOperationsKeepEveryViewConsistent(seed: UInt64) throws {
        let server = try ServerProcess(arguments: ["--threads", Self.threads(seed), "--parallel-threshold", "1"], environment: internalChecks)
        try server.connect().request(#"{"op":"schema","required":{"Msg":["from"]}}"#)
        let workers = 6
        let opsPerWorker = Self.soak ? 3000 : 250
        var players: [Player] = []
        for w in 0..<workers {
            players.append(try Player(server: server, index: w, seed: seed &* 1000 &+ UInt64(w)))
        }
        let group = DispatchGroup()
        let failures = FailureLog()
        for p in players {
            group.enter()
            let thread = Thread {
                do { try p.play(ops: opsPerWorker) } catch { failures.add("player \(p.index): \(error)") }
                group.leave()
            }
            thread.stackSize = 8 << 20
            thread.start()
        }
        group.wait()
        #expect(failures.all.isEmpty, "\(failures.all)")
        // Barrier, then bring paused views up to date, then barrier again.
        for p in players { try p.finish() }
        let checker = try server.connect()
        for p in players {
            try p.verify(against: checker)
        }
        #expect(server.stop() == 0)
    }
}

final class FailureLog: @unchecked Sendable {
    // Sendable: guarded by `lock`.
    private let lock = NSLock()
    private var items: [String] = []
    func add(_ s: String) { lock.lock(); items.append(s); lock.unlock() }
    var all: [String] { lock.lock(); defer { lock.unlock() }; return items }
}

/// One connection's random session and the client-side copy of its views.
final class Player: @unchecked Sendable {
    // Sendable: used by one thread at a time (its own, then the test's after join).
    let index: Int
    let client: WireClient
    var rng: SeededRandom
    static let entityCount = 16
    static let keys = ["k0", "k1", "k2"]

    enum Kind { case model, key, ids, feed }
    struct SubState {
        var kind: Kind
        var key: String? = nil
        var live = true
        var paused = false
        var model: JSON = .null
        var entities: [String: JSON] = [:]
        var lastSeq = -1
        var seenEntityEvents: Set<String> = []
    }
    var subs: [String: SubState] = [:]
    var problems: [String] = []

    init(server: ServerProcess, index: Int, seed: UInt64) throws {
        self.index = index
        client = try server.connect()
        client.setTimeout(30)
        rng = SeededRandom(seed: seed)
    }

    func id(_ i: Int) -> String { i % 3 == 0 ? "Msg:\(i)" : "P:\(i)" }

    func randomEntity(depth: Int = 0) -> String {
        let i = Int.random(in: 0..<Self.entityCount, using: &rng)
        let me = id(i)
        var fields = [#""id":"\#(me)""#, #""v":\#(Int.random(in: 0..<5, using: &rng))"#]
        if depth < 2 && Bool.random(using: &rng) {
            // Point only at higher-numbered entities so trees stay acyclic.
            let j = Int.random(in: 0..<Self.entityCount, using: &rng)
            if j > i { fields.append(#""from":{"id":"\#(id(j))","v":\#(Int.random(in: 0..<5, using: &rng))}"#) }
        }
        if i % 3 == 0 && !fields.contains(where: { $0.hasPrefix(#""from""#) }) {
            fields.append(#""from":{"id":"P:\#(Self.entityCount + i)"}"#)
        }
        return "{" + fields.joined(separator: ",") + "}"
    }

    func subscribeAll() throws {
        try subscribe("m", #""model":{"list":[\#(randomEntity()),\#(randomEntity())]},"refresh":true"#, .model)
        let key = Self.keys[index % Self.keys.count]
        try subscribe("k", #""key":"\#(key)""#, .key, key: key)
        let ids = (0..<Self.entityCount).map { #""\#(id($0))""# }.joined(separator: ",")
        try subscribe("i", #""ids":[\#(ids)]"#, .ids)
        try subscribe("f", #""feed":{}"#, .feed)
    }

    func subscribe(_ name: String, _ body: String, _ kind: Kind, key: String? = nil) throws {
        let r = try request(#"{"op":"subscribe","sub":"\#(name)",\#(body)}"#)
        guard r["ok"] == true else { throw TestFailure("subscribe \(name) failed: \(r.compactString)") }
        var s = SubState(kind: kind)
        s.key = key
        s.lastSeq = r["seq"]!.numberValue!.intValue!
        switch kind {
        case .model, .key: s.model = r["model"]!
        case .ids: for m in r["models"]!.objectValue!.members { s.entities[m.key] = m.value }
        case .feed: break
        }
        subs[name] = s
    }

    /// Sends, reads up to the response, applies the events in between.
    @discardableResult
    func request(_ line: String) throws -> JSON {
        let r = try client.request(line)
        for e in client.take() { apply(e) }
        return r
    }

    func apply(_ e: JSON) {
        let name = e["sub"]!.stringValue!
        let seq = e["seq"]!.numberValue!.intValue!
        guard var s = subs[name], s.live else {
            problems.append("event for dead subscription \(name): \(e.compactString)")
            return
        }
        switch e["event"]!.stringValue! {
        case "delete":
            s.live = false
        case "update":
            if seq <= s.lastSeq { problems.append("\(name): seq \(seq) after \(s.lastSeq)") }
            s.model = e["model"]!
        case "entity":
            let id = e["id"]!.stringValue!
            if seq < s.lastSeq { problems.append("\(name): seq \(seq) after \(s.lastSeq)") }
            if !s.seenEntityEvents.insert("\(seq)/\(id)").inserted { problems.append("\(name): duplicate entity event \(seq)/\(id)") }
            s.entities[id] = e["model"]!
        default:
            problems.append("unexpected event \(e.compactString)")
        }
        s.lastSeq = max(s.lastSeq, seq)
        subs[name] = s
    }

    func play(ops: Int) throws {
        try subscribeAll()
        for _ in 0..<ops {
            let roll = Int.random(in: 0..<100, using: &rng)
            switch roll {
            case 0..<35:
                try mutate(#"{"op":"update","model":\#(randomEntity())}"#)
            case 35..<45:
                try mutate(#"{"op":"update","mode":"merge","model":{"id":"\#(id(Int.random(in: 0..<Self.entityCount, using: &rng)))","w":\#(Int.random(in: 0..<3, using: &rng))}}"#)
            case 45..<55:
                let key = Self.keys.randomElement(using: &rng)!
                try mutate(#"{"op":"update","key":"\#(key)","model":{"items":[\#(randomEntity()),\#(randomEntity())]}}"#)
            case 55..<63:
                try mutate(#"{"op":"delete","id":"\#(id(Int.random(in: 0..<(Self.entityCount * 2), using: &rng)))"}"#)
            case 63..<66:
                try mutate(#"{"op":"delete","key":"\#(Self.keys.randomElement(using: &rng)!)"}"#)
            case 66..<78:
                let n = Int.random(in: 2...4, using: &rng)
                var parts: [String] = []
                for _ in 0..<n {
                    if Int.random(in: 0..<4, using: &rng) == 0 {
                        parts.append(#"{"op":"delete","id":"\#(id(Int.random(in: 0..<Self.entityCount, using: &rng)))"}"#)
                    } else {
                        parts.append(#"{"op":"update","model":\#(randomEntity())}"#)
                    }
                }
                try mutate(#"{"op":"batch","ops":[\#(parts.joined(separator: ","))],"context":\#(index)}"#)
            case 78..<86:
                let name = ["m", "k", "i", "f"].randomElement(using: &rng)!
                if let s = subs[name], s.live {
                    let op = s.paused ? "resume" : "pause"
                    try request(#"{"op":"\#(op)","sub":"\#(name)"}"#)
                    subs[name]?.paused.toggle()
                }
            case 86..<90:
                try mutate(#"{"op":"update","model":\#(randomEntity()),"force":true}"#)
            default:
                // Re-open ended views under the same name.
                if subs["m"]?.live == false {
                    try subscribe("m", #""model":{"list":[\#(randomEntity())]},"refresh":true"#, .model)
                }
                if subs["k"]?.live == false {
                    let key = Self.keys.randomElement(using: &rng)!
                    try subscribe("k", #""key":"\#(key)""#, .key, key: key)
                }
                _ = try request(#"{"op":"ping"}"#)
            }
        }
    }

    func mutate(_ line: String) throws {
        let r = try request(line)
        if r["ok"] != true { problems.append("mutation refused: \(r.compactString) for \(line)") }
    }

    func finish() throws {
        _ = try request(#"{"op":"ping"}"#)
        for (name, s) in subs where s.live && s.paused {
            try request(#"{"op":"resume","sub":"\#(name)"}"#)
            subs[name]?.paused = false
        }
        _ = try request(#"{"op":"ping"}"#)
    }

    func verify(against checker: WireClient) throws {
        #expect(problems.isEmpty, "player \(index): \(problems.prefix(5))")
        for (_, s) in subs where s.live {
            switch s.kind {
            case .key:
                let key = s.key!
                let current = try checker.request(#"{"op":"get","key":"\#(key)"}"#)["model"]!
                #expect(s.model == current, "player \(index) key view \(key): \(s.model.compactString) vs \(current.compactString)")
            case .ids:
                for (id, v) in s.entities {
                    let current = try checker.request(#"{"op":"get","id":"\#(id)"}"#)["model"]!
                    #expect(v == current, "player \(index) ids view \(id): \(v.compactString) vs \(current.compactString)")
                }
            case .model:
                var stack = [s.model]
                while let v = stack.popLast() {
                    switch v {
                    case .object(let o):
                        if let id = o.identity(idKey: "id") {
                            let current = try checker.request(#"{"op":"get","id":"\#(id)"}"#)["model"]!
                            #expect(v == current, "player \(index) model view entity \(id): \(v.compactString) vs \(current.compactString)")
                        }
                        for m in o.members { stack.append(m.value) }
                    case .array(let a):
                        stack.append(contentsOf: a)
                    default:
                        break
                    }
                }
            case .feed:
                break
            }
        }
    }

}

/// Issue 3's property test: two writers issue random collection ops (and
/// entity updates/deletes touching their items) at the same time; a third
/// connection applies every event's changes to its copies and, after a
/// `ping` barrier, must hold exactly what `get` returns.
@Suite(.serialized)
struct CollectionStressTests {
    @Test(arguments: StressTests.soak ? Array(1...10) : [1, 2, 3] as [UInt64])
    func concurrentWritersAndAnObserverConverge(seed: UInt64) throws {
        let server = try ServerProcess(arguments: ["--threads", StressTests.threads(seed), "--parallel-threshold", "1"], environment: internalChecks)
        let setup = try server.connect()
        try setup.request(#"{"op":"schema","required":{"Row":["owner"]}}"#)
        let observer = try server.connect()
        observer.setTimeout(60)
        let names = ["x", "y"]
        var copies: [String: [JSON]] = [:]
        var live: Set<String> = []
        func subscribe(_ n: String) throws {
            let r = try observer.request(#"{"op":"subscribe","sub":"\#(n)","collection":"\#(n)"}"#)
            copies[n] = r["items"]!.arrayValue!
            live.insert(n)
        }
        for n in names { try subscribe(n) }
        let opsPerWriter = StressTests.soak ? 5000 : 1500
        let failures = FailureLog()
        let group = DispatchGroup()
        for w in 0..<2 {
            group.enter()
            let client = try server.connect()
            client.setTimeout(30)
            Thread {
                defer { group.leave() }
                var rng = SeededRandom(seed: seed &* 7919 &+ UInt64(w))
                func item() -> String {
                    let i = Int.random(in: 0..<10, using: &rng)
                    if i < 4 {
                        return #"{"id":"Row:\#(i)","n":\#(Int.random(in: 0..<5, using: &rng)),"owner":{"id":"U:\#(Int.random(in: 0..<3, using: &rng))","v":\#(Int.random(in: 0..<3, using: &rng))}}"#
                    }
                    return #"{"id":"E:\#(i)","n":\#(Int.random(in: 0..<5, using: &rng))}"#
                }
                func op(inBatch: Bool = false) -> String {
                    let c = names.randomElement(using: &rng)!
                    switch Int.random(in: 0..<(inBatch ? 18 : 20), using: &rng) {
                    case 0: return #"{"op":"collection.set","collection":"\#(c)","items":[\#(item()),\#(item()),\#(item()),\#(item())]}"#
                    case 1...4: return #"{"op":"collection.insert","collection":"\#(c)","index":\#(Int.random(in: 0..<6, using: &rng)),"items":[\#(item())]}"#
                    case 5...7: return #"{"op":"collection.insert","collection":"\#(c)","items":[\#(item()),\#(item())]}"#
                    case 8...10: return #"{"op":"collection.remove","collection":"\#(c)","index":\#(Int.random(in: 0..<6, using: &rng)),"count":\#(Int.random(in: 1...2, using: &rng))}"#
                    case 11: return #"{"op":"collection.remove","collection":"\#(c)","ids":["E:\#(Int.random(in: 4..<10, using: &rng))","Row:\#(Int.random(in: 0..<4, using: &rng))"]}"#
                    case 12: return #"{"op":"collection.delete","collection":"\#(c)"}"#
                    case 13, 14: return #"{"op":"update","model":\#(item())}"#
                    case 15: return #"{"op":"update","model":{"id":"U:\#(Int.random(in: 0..<3, using: &rng))","v":\#(Int.random(in: 0..<9, using: &rng))}}"#
                    case 16: return #"{"op":"delete","id":"U:\#(Int.random(in: 0..<3, using: &rng))"}"#
                    case 17: return #"{"op":"delete","id":"E:\#(Int.random(in: 4..<10, using: &rng))"}"#
                    default: return #"{"op":"batch","ops":[\#(op(inBatch: true)),\#(op(inBatch: true))]}"#
                    }
                }
                do {
                    for _ in 0..<opsPerWriter {
                        let r = try client.request(op())
                        if r["ok"] != true {
                            let code = r["error"]?["code"]?.stringValue ?? "?"
                            if code != "bad_index" { failures.add("unexpected refusal: \(r.compactString)") }
                        }
                    }
                } catch {
                    failures.add("writer \(w): \(error)")
                }
            }.start()
        }
        // The observer keeps reading while the writers run, re-subscribing ended views.
        func drain() throws {
            for e in observer.take() {
                let n = e["sub"]!.stringValue!
                if e["event"] == "delete" {
                    live.remove(n)
                    continue
                }
                #expect(e["event"] == "collection")
                try applyChanges(&copies[n, default: []], e)
            }
        }
        while group.wait(timeout: .now()) == .timedOut {
            _ = try observer.request(#"{"op":"ping"}"#)
            try drain()
            for n in names where !live.contains(n) { try subscribe(n) }
            try drain()
        }
        group.wait()
        #expect(failures.all.isEmpty, "\(failures.all.prefix(3))")
        _ = try observer.request(#"{"op":"ping"}"#)
        try drain()
        for n in names where !live.contains(n) { try subscribe(n) }
        for n in names {
            let server = try observer.request(#"{"op":"get","collection":"\#(n)"}"#)["items"]!.arrayValue!
            #expect(copies[n]! == server, "seed \(seed): collection \(n) diverged")
        }
        #expect(server.stop() == 0)
    }
}
