import ConcordJSON
import ConcordProtocol
import Synchronization
import Testing

@testable import ConcordCore

/// A cluster log in memory: each host's appends of one pump become one
/// entry, chained like the Redis script chains them.
final class FakeLog {
    var entries: [ClusterEntry] = []
    var hash = ""
    var epoch = "e1"
    var time = 1_000.0

    func append(origin: String, _ mutations: [(ref: Int, line: [UInt8])]) {
        guard !mutations.isEmpty else { return }
        let offset = (entries.last?.offset ?? 0) + 1
        let prev = hash
        hash = String(ClusterState.fold(0, prev + "|" + origin + "|\(offset)"), radix: 16)
        time += 0.5
        entries.append(ClusterEntry(offset: offset, previousHash: prev, hash: hash, epoch: epoch, time: time,
                                    origin: origin, mutations: mutations))
    }
}

/// One host on a fake log, on a clock the test sets.
final class ClockedHost {
    /// The time, shared with the engine's clock closure.
    final class Time: Sendable {
        let now = Mutex(0.0)
    }
    let cluster = FakeCluster(hosts: 1)
    var engine: Engine { cluster.hosts[0].engine }
    private let time = Time()

    init() { engine.clock = { [time] in time.now.withLock { $0 } } }

    func set(_ t: Double) { time.now.withLock { $0 = t } }
}

/// Hosts (engines) sharing one ``FakeLog``; each reads the log up to its own position.
final class FakeCluster {
    let log = FakeLog()
    var hosts: [EngineHarness] = []
    var read: [Int] = []
    /// A test that damages the log expects hosts to stop following it.
    var expectBroken = false

    init(hosts n: Int) {
        for i in 0..<n {
            let h = EngineHarness()
            h.engine.enableCluster(ClusterSettings(name: "t", host: "h\(i)", origin: "h\(i)#run", timeout: 5))
            h.engine.clusterEvent(.attached(epoch: "", head: 0))
            hosts.append(h)
            read.append(0)
        }
    }

    /// Every host's appends go into the log (host order), then `upTo` hosts read what they have not.
    func pump(readers: [Int]? = nil) {
        for (i, h) in hosts.enumerated() { log.append(origin: "h\(i)#run", h.engine.takeClusterAppends()) }
        for i in readers ?? Array(hosts.indices) { deliver(i) }
    }

    /// A new host loaded from host `from`'s snapshot (encoded and decoded), reading the log after it.
    func join(from: Int) throws -> Int {
        let bytes = hosts[from].engine.clusterSnapshot().encode()
        let snapshot = try ClusterSnapshot.decode(bytes, maxDepth: 128)
        let h = EngineHarness()
        let i = hosts.count
        h.engine.enableCluster(ClusterSettings(name: "t", host: "h\(i)", origin: "h\(i)#run", timeout: 5))
        try h.engine.loadClusterSnapshot(snapshot)
        h.engine.clusterEvent(.attached(epoch: snapshot.epoch, head: log.entries.count))
        hosts.append(h)
        read.append(snapshot.offset)
        // The same state encodes to the same bytes.
        let again = h.engine.clusterSnapshot().encode()
        #expect(again == bytes, "\(String(decoding: again, as: UTF8.self).split(separator: "\n").filter { !String(decoding: bytes, as: UTF8.self).contains($0) }.prefix(3))")
        return i
    }

    /// One host and a connection to it.
    static func oneHost() -> (FakeCluster, Engine, TestConn) {
        let cl = FakeCluster(hosts: 1)
        return (cl, cl.hosts[0].engine, cl.hosts[0].connect())
    }

    func deliver(_ i: Int) {
        let h = hosts[i]
        while read[i] < log.entries.count {
            if !h.engine.applyClusterEntry(log.entries[read[i]]) { expectBroken = true }
            read[i] += 1
        }
        #expect(expectBroken || h.engine.clusterBroken == nil)
        h.engine.clusterEvent(.head(log.entries.count))
        h.pumpPublic()
    }
}

@Suite struct ClusterCoreTests {
    @Test func aMutationIsAnsweredWhenTheLogBringsItBackWithTheSameSeqEverywhere() {
        let cl = FakeCluster(hosts: 3)
        let writer = cl.hosts[0].connect()
        let watcher = cl.hosts[2].connect()
        watcher.ok(#"{"op":"subscribe","sub":"p","model":{"id":"P1","name":"Ada"}}"#)
        writer.post(#"{"rid":1,"op":"update","model":{"id":"P1","name":"Grace"}}"#)
        // Not applied anywhere before the log brings it back.
        #expect(writer.takeResponses().isEmpty)
        #expect(cl.hosts[0].engine.seq == 0)
        cl.pump()
        let r = writer.takeResponses()
        #expect(r.count == 1 && r[0]["ok"] == true && r[0]["seq"] == 1)
        let events = watcher.take()
        #expect(events.count == 1 && events[0]["seq"] == 1 && events[0]["model"]?["name"] == "Grace")
        #expect(Set(cl.hosts.map { $0.engine.stateDigest() }).count == 1)
        // A rejected mutation takes a log position and no seq.
        writer.post(#"{"rid":2,"op":"update","model":{"id":"P1","name":"X"},"if_unchanged_since":0}"#)
        cl.pump()
        #expect(writer.takeResponses().first?["error"]?["code"] == "conflict")
        #expect(cl.hosts.allSatisfy { $0.engine.seq == 1 && $0.engine.clusterAppliedOffset == 2 })
    }

    @Test func requestsBehindAnAppendedMutationWaitForIt() {
        let cl = FakeCluster(hosts: 2)
        let c = cl.hosts[0].connect()
        c.post(#"{"rid":1,"op":"update","key":"k","model":{"v":1}}"#)
        c.post(#"{"rid":2,"op":"get","key":"k"}"#)
        #expect(c.takeResponses().isEmpty)
        cl.pump()
        let r = c.takeResponses()
        #expect(r.map { $0["rid"] } == [1, 2])
        #expect(r[1]["model"]?["v"] == 1)
    }

    @Test func pipelinedMutationsShareTheLogAndAnswersStayInOrder() {
        let (cl, engine, c) = FakeCluster.oneHost()
        c.post(#"{"rid":1,"op":"update","model":{"id":"A","v":1}}"#)
        c.post(#"{"rid":2,"op":"update","model":{"id":"A","v":2}}"#)
        c.post(#"{"rid":3,"op":"get","id":"A"}"#)
        c.post(#"{"rid":4,"op":"update","model":{"id":"A","v":4}}"#)
        // The first two are in the log together; the read and what follows it wait.
        #expect(engine.takeClusterAppends().map(\.ref) == [1, 2])
        #expect(c.takeResponses().isEmpty)
        cl.log.append(origin: "h0#run", [(1, Array(#"{"rid":1,"op":"update","model":{"id":"A","v":1}}"#.utf8)),
                                         (2, Array(#"{"rid":2,"op":"update","model":{"id":"A","v":2}}"#.utf8))])
        cl.deliver(0)
        cl.pump()
        let r = c.takeResponses()
        #expect(r.map { $0["rid"] } == [1, 2, 3, 4])
        #expect(r[2]["model"]?["v"] == 2)
        #expect(r[3]["seq"] == 3)
    }

    @Test func aConnectionHasABoundedNumberOfMutationsInTheLog() {
        let (cl, engine, c) = FakeCluster.oneHost()
        for i in 0..<1100 { c.post(#"{"rid":\#(i),"op":"update","model":{"id":"A","v":\#(i)}}"#) }
        let taken = engine.takeClusterAppends()
        #expect(taken.count == ClusterState.maxPendingPerConnection)
        // The rest waits behind them, and the driver stops feeding (and reading) the connection.
        #expect(engine.isWaiting(c.id))
        cl.log.append(origin: "h0#run", taken)
        cl.pump()
        cl.pump()
        let rids = c.takeResponses().map { $0["rid"]?.numberValue?.intValue ?? -1 }
        #expect(rids == Array(0..<1100), "\(rids.count) answers, first wrong at \(rids.indices.first { rids[$0] != $0 } ?? -1)")
    }

    @Test func aFailureBehindAMutationStillInTheLogIsAnsweredAfterIt() {
        let (cl, engine, c) = FakeCluster.oneHost()
        c.post(#"{"rid":1,"op":"update","model":{"id":"A","v":1}}"#)
        let first = engine.takeClusterAppends()
        c.post(#"{"rid":2,"op":"update","model":{"id":"A","v":2}}"#)
        _ = engine.takeClusterAppends()
        // The second one's append fails first (another entry, refused); the first is still in the log.
        engine.clusterEvent(.appendFailed(refs: [2], indeterminate: false, reason: "test"))
        cl.hosts[0].pumpPublic()
        #expect(c.takeResponses().isEmpty)
        cl.log.append(origin: "h0#run", first)
        cl.deliver(0)
        let r = c.takeResponses()
        #expect(r.map { $0["rid"] } == [1, 2])
        #expect(r[0]["seq"] == 1 && r[1]["error"]?["code"] == "unavailable")
        // Detached: a mutation behind one in the log waits, then is refused in its turn.
        c.post(#"{"rid":3,"op":"update","model":{"id":"A","v":3}}"#)
        let third = engine.takeClusterAppends()
        engine.clusterEvent(.detached(reason: "test"))
        c.post(#"{"rid":4,"op":"update","model":{"id":"A","v":4}}"#)
        #expect(engine.takeClusterAppends().isEmpty)
        cl.log.append(origin: "h0#run", third)
        cl.deliver(0)
        let late = c.takeResponses()
        #expect(late.map { $0["rid"] } == [3, 4])
        #expect(late[1]["error"]?["code"] == "unavailable")
    }

    @Test func aMutationTheLogLostIsAnsweredBeforeANewerOneThatCameBack() {
        let (cl, engine, c) = FakeCluster.oneHost()
        c.post(#"{"rid":1,"op":"update","model":{"id":"A","v":1}}"#)
        let first = engine.takeClusterAppends()
        cl.log.append(origin: "h0#run", first)
        // A failover: the log loses its tail (the first mutation) before this host read it…
        cl.log.entries.removeAll()
        cl.log.hash = ""
        // …and the connection's next mutation goes in after it.
        c.post(#"{"rid":2,"op":"update","model":{"id":"A","v":2}}"#)
        c.post(#"{"rid":3,"op":"get","id":"A"}"#)
        cl.pump()
        let r = c.takeResponses()
        #expect(r.map { $0["rid"] } == [1, 2, 3])
        #expect(r.first?["error"]?["code"] == "unavailable" && r.first?["error"]?["indeterminate"] == true)
        #expect(r.count == 3 && r[1]["seq"] == 1 && r[2]["model"]?["v"] == 2)
        // Nothing is left to time out, and the connection is not waiting.
        #expect(!engine.hasClusterWaits && !engine.isWaiting(c.id))
        // A failure that waited behind the lost one is answered in its turn.
        c.post(#"{"rid":4,"op":"update","model":{"id":"A","v":4}}"#)
        let fourth = engine.takeClusterAppends()
        c.post(#"{"rid":5,"op":"update","model":{"id":"A","v":5}}"#)
        let fifth = engine.takeClusterAppends()
        c.post(#"{"rid":6,"op":"update","model":{"id":"A","v":6}}"#)
        engine.clusterEvent(.appendFailed(refs: fifth.map(\.ref), indeterminate: false, reason: "test"))
        #expect(c.takeResponses().isEmpty)
        _ = fourth
        cl.pump()
        let late = c.takeResponses()
        #expect(late.map { $0["rid"] } == [4, 5, 6])
        #expect(late.count == 3 && late[0]["error"]?["indeterminate"] == true && late[1]["error"]?["code"] == "unavailable" && late[2]["seq"] == 2)
    }

    @Test func randomOperationsOnThreeHostsLeaveEqualStates() {
        var rng = SplitMix(seed: 0xC0FFEE)
        let cl = FakeCluster(hosts: 3)
        var conns: [[TestConn]] = cl.hosts.map { h in (0..<3).map { _ in h.connect() } }
        for (hi, h) in conns.enumerated() {
            for (ci, c) in h.enumerated() {
                c.ok(#"{"op":"subscribe","sub":"f","feed":{}}"#)
                c.ok(#"{"op":"subscribe","sub":"k\#(ci)","key":"k\#((hi + ci) % 4)"}"#)
            }
        }
        for round in 0..<300 {
            for _ in 0..<Int(rng.next() % 6) {
                let h = Int(rng.next() % 3), c = Int(rng.next() % 3)
                let id = rng.next() % 12, v = rng.next() % 50
                let line: String
                switch rng.next() % 9 {
                case 0, 1, 2: line = #"{"rid":\#(round),"op":"update","model":{"id":"E\#(id)","v":\#(v),"friend":{"id":"E\#((id + 1) % 12)"}}}"#
                case 3: line = #"{"rid":\#(round),"op":"update","key":"k\#(id % 4)","model":{"a":{"id":"E\#(id)","w":\#(v)}}}"#
                case 4: line = #"{"rid":\#(round),"op":"delete","id":"E\#(id)"}"#
                case 5: line = #"{"rid":\#(round),"op":"update","model":{"id":"E\#(id)","v":\#(v)},"if_unchanged_since":\#(max(0, cl.hosts[h].engine.seq - Int(v % 3)))}"#
                case 6: line = #"{"rid":\#(round),"op":"update","model":{"id":"T\#(v % 5)"},"token":"tok\#(v % 7)"}"#
                case 7: line = #"{"rid":\#(round),"op":"batch","ops":[{"op":"update","model":{"id":"E\#(id)","v":1}},{"op":"collection.insert","collection":"L","index":\#(v % 3),"items":[{"id":"E\#(v % 12)"}]}]}"#
                default: line = #"{"rid":\#(round),"op":"collection.set","collection":"L","items":[{"id":"E\#(id)"}]}"#
                }
                conns[h][c].post(line)
            }
            // Hosts read at different times: sometimes one lags a round.
            let lagging = Int(rng.next() % 4)
            cl.pump(readers: (0..<3).filter { $0 != lagging })
        }
        cl.pump()
        let digests = Set(cl.hosts.map { $0.engine.stateDigest() })
        let outcomes = Set(cl.hosts.map { $0.engine.clusterOutcomeDigest })
        let seqs = Set(cl.hosts.map { $0.engine.seq })
        #expect(digests.count == 1)
        #expect(outcomes.count == 1)
        #expect(seqs.count == 1 && seqs.first! > 100)
        // Every feed got the same events, byte for byte, on every host.
        let feeds = conns.map { h in h[0].take().filter { $0["sub"] == "f" }.map { $0.compactString } }
        #expect(feeds[0].count > 100 && feeds[0] == feeds[1] && feeds[1] == feeds[2])
        conns = []
    }

    @Test func aHostLoadedFromASnapshotDecidesLikeTheOthers() throws {
        var rng = SplitMix(seed: 0x5EED)
        let cl = FakeCluster(hosts: 2)
        let conns = cl.hosts.map { $0.connect() }
        func randomWrites(_ n: Int, round: Int) {
            for k in 0..<n {
                let id = rng.next() % 10, v = rng.next() % 9
                let line: String
                switch rng.next() % 7 {
                case 0, 1: line = #"{"op":"update","model":{"id":"E\#(id)","v":\#(v),"p":{"id":"E\#((id + 3) % 10)"}}}"#
                case 2: line = #"{"op":"delete","id":"E\#(id)"}"#
                // Conditional writes on live and deleted names: decided by last-change seqs and tombstones.
                case 3: line = #"{"op":"update","model":{"id":"E\#(id)","v":0},"if_unchanged_since":\#(max(0, cl.hosts[0].engine.seq - Int(v)))}"#
                // Tokens, retried: answered as duplicates from the remembered table.
                case 4: line = #"{"op":"update","model":{"id":"T\#(v)","r":\#(round)},"token":"k\#(v)"}"#
                case 5: line = #"{"op":"update","key":"doc\#(id % 3)","model":{"x":{"id":"E\#(id)"}},"if_unchanged_since":\#(max(0, cl.hosts[0].engine.seq - 2))}"#
                default: line = #"{"op":"collection.insert","collection":"L\#(id % 2)","index":0,"items":[{"id":"E\#(id)"}]}"#
                }
                conns[k % 2].post(line)
            }
            cl.pump()
        }
        for r in 0..<60 { randomWrites(5, round: r) }
        let admin = cl.hosts[0].connect()
        admin.post(#"{"op":"schema","required":{"Doc":["owner"]}}"#)
        cl.pump()
        #expect(admin.takeResponses().first?["required"]?["Doc"] == .array(["owner"]))
        let joined = try cl.join(from: 1)
        #expect(cl.hosts[joined].engine.stateDigest() == cl.hosts[0].engine.stateDigest())
        for r in 60..<160 { randomWrites(5, round: r) }
        let digests = Set(cl.hosts.map { $0.engine.stateDigest() })
        #expect(digests.count == 1)
        // Outcomes after the snapshot agree too (the joined host's running hash started later: compare its own run).
        #expect(cl.hosts[joined].engine.seq == cl.hosts[0].engine.seq)
        // A feed resumed from before the snapshot on the joined host is told the history does not reach back.
        let c = cl.hosts[joined].connect()
        let r = c.send(#"{"op":"subscribe","sub":"f","feed":{},"since":1}"#)
        #expect(r["ok"] == true && r["truncated"] == true)
    }

    @Test func aHostRebuildsFromTheLogItHasAndNoSeqGoesBackwards() throws {
        let cl = FakeCluster(hosts: 2)
        let writer = cl.hosts[0].connect()
        let watcher = cl.hosts[1].connect()
        watcher.ok(#"{"op":"subscribe","sub":"a","ids":["A","B"]}"#)
        watcher.ok(#"{"op":"subscribe","sub":"k","key":"doc"}"#)
        for v in 1...10 {
            writer.post(v % 3 == 0 ? #"{"op":"update","key":"doc","model":{"a":{"id":"A"},"v":\#(v)}}"# : #"{"op":"update","model":{"id":"A","v":\#(v)}}"#)
            cl.pump()
        }
        _ = watcher.take()
        #expect(cl.hosts.allSatisfy { $0.engine.seq == 10 })
        // The log loses its last 5 entries (restored from an older copy), then another host appends to it.
        cl.expectBroken = true
        cl.log.entries.removeLast(5)
        cl.log.hash = cl.log.entries.last!.hash
        cl.log.append(origin: "other#run", [(1, Array(#"{"op":"update","model":{"id":"B","v":99}}"#.utf8))])
        cl.read = [5, 5]
        for i in 0..<2 { cl.deliver(i) }
        #expect(cl.hosts.allSatisfy { $0.engine.clusterLink == .resyncing })
        #expect(writer.send(#"{"op":"update","model":{"id":"A","v":0}}"#)["error"]?["code"] == "unavailable")
        // The driver fetches what the log holds (it starts at offset 1: no snapshot) and reads it again.
        for (i, h) in cl.hosts.enumerated() {
            #expect(h.engine.takeClusterResyncWanted())
            #expect(!h.engine.takeClusterResyncWanted())
            try h.engine.beginClusterResync(from: nil)
            cl.read[i] = 0
        }
        cl.pump()
        cl.pump()
        for h in cl.hosts {
            #expect(h.engine.clusterLink == .attached)
            #expect(h.engine.seq == 11)  // not 6: one past what clients saw before
            #expect(h.engine.clusterBroken == nil)
        }
        #expect(cl.hosts[0].engine.stateDigest() == cl.hosts[1].engine.stateDigest())
        // Each view got one coalesced event from what it was last sent to the log's state.
        let events = watcher.take()
        #expect(events.count == 3, "\(events.map(\.compactString))")
        #expect(events.allSatisfy { $0["coalesced"] == true && $0["seq"] == 11 })
        #expect(events.contains { $0["sub"] == "a" && $0["id"] == "B" && $0["model"]?["v"] == 99 })
        #expect(watcher.send(#"{"op":"get","id":"A"}"#)["model"]?["v"] == 5)
        #expect(watcher.send(#"{"op":"ping"}"#)["cluster"]?["resyncs"] == 1)
        // Writes go on, numbered alike everywhere after the highest seq any host had.
        writer.post(#"{"op":"update","model":{"id":"A","v":11}}"#)
        cl.pump()
        #expect(writer.takeResponses().last?["seq"] == 12)
        #expect(cl.hosts.allSatisfy { $0.engine.seq == 12 })
    }

    @Test func aGapARollbackAndANewEpochStopTheHostFollowing() {
        for damage in ["gap", "rollback", "epoch"] {
            let cl = FakeCluster(hosts: 1)
            let c = cl.hosts[0].connect()
            c.post(#"{"op":"update","model":{"id":"A","v":1}}"#)
            cl.pump()
            let engine = cl.hosts[0].engine
            var next = ClusterEntry(offset: 2, previousHash: cl.log.hash, hash: "x", epoch: "e1", time: 0,
                                    origin: "other", mutations: [(1, Array(#"{"op":"update","model":{"id":"A","v":2}}"#.utf8))])
            // The same entry read twice is skipped, not an error.
            #expect(engine.applyClusterEntry(cl.log.entries[0]))
            switch damage {
            case "gap": next.offset = 3
            case "rollback": next.previousHash = "not-the-chain"
            default: next.epoch = "e2"
            }
            #expect(!engine.applyClusterEntry(next), "\(damage)")
            #expect(engine.clusterLink == .resyncing)
            #expect(engine.seq == 1)
            let r = c.send(#"{"op":"update","model":{"id":"A","v":3}}"#)
            #expect(r["error"]?["code"] == "unavailable")
            #expect(c.send(#"{"op":"ping"}"#)["cluster"]?["state"] == "resyncing")
        }
    }

    @Test func detachedRefusesAtOnceAndALostAnswerIsIndeterminate() {
        let h = ClockedHost()
        let (cl, engine, c) = (h.cluster, h.engine, h.cluster.hosts[0].connect())
        engine.clusterEvent(.detached(reason: "test"))
        let r = c.send(#"{"rid":1,"op":"update","model":{"id":"A"}}"#)
        #expect(r["error"]?["code"] == "unavailable" && r["error"]?["indeterminate"] == nil)
        #expect(c.send(#"{"op":"get","id":"A"}"#)["ok"] == true)
        engine.clusterEvent(.attached(epoch: "", head: 0))
        c.post(#"{"rid":2,"op":"update","model":{"id":"A"},"token":"t1"}"#)
        _ = engine.takeClusterAppends()  // sent; the answer never comes
        h.set(6)
        engine.expireClusterWaits()
        cl.hosts[0].pumpPublic()
        let late = c.takeResponses()
        #expect(late.count == 1 && late[0]["error"]?["indeterminate"] == true)
        // The connection goes on; the entry, if it arrives after all, is applied once, answered to nobody.
        #expect(c.send(#"{"rid":3,"op":"ping"}"#)["rid"] == 3)
    }

    /// An append the log took gets its own timeout for this host to apply
    /// it; past that the answer is still `indeterminate`, and says it is in the log.
    @Test func aConfirmedAppendWaitsForItsApplyAndThenSaysItIsInTheLog() {
        let h = ClockedHost()
        let (cl, engine, c) = (h.cluster, h.engine, h.cluster.hosts[0].connect())
        c.post(#"{"rid":1,"op":"update","model":{"id":"A","v":1}}"#)
        c.post(#"{"rid":2,"op":"update","model":{"id":"B","v":1}}"#)
        let sent = engine.takeClusterAppends()
        #expect(sent.count == 2)
        h.set(4)
        engine.clusterEvent(.appendConfirmed(refs: sent.map(\.ref)))
        h.set(6)  // past the first deadline (5 s), within the confirmed one (4 + 5)
        engine.expireClusterWaits()
        cl.hosts[0].pumpPublic()
        #expect(c.takeResponses().isEmpty)
        // The first comes back and is answered with its seq; the second never does.
        cl.log.append(origin: "h0#run", [sent[0]])
        cl.deliver(0)
        h.set(9.5)
        engine.expireClusterWaits()
        cl.hosts[0].pumpPublic()
        let answers = c.takeResponses()
        #expect(answers.count == 2)
        #expect(answers.first?["rid"] == 1 && answers.first?["seq"] == 1)
        #expect(answers.last?["rid"] == 2 && answers.last?["error"]?["indeterminate"] == true)
        #expect(answers.last?["error"]?["message"]?.stringValue?.contains("is in the cluster log") == true)
    }

    @Test func syncWaitsForTheLogsHead() {
        let cl = FakeCluster(hosts: 2)
        let a = cl.hosts[0].connect(), b = cl.hosts[1].connect()
        a.post(#"{"op":"update","model":{"id":"A","v":1}}"#)
        cl.pump(readers: [0])
        b.post(#"{"rid":"s","op":"sync"}"#)
        #expect(b.takeResponses().isEmpty)
        #expect(cl.hosts[1].engine.takeClusterHeadWanted())
        cl.hosts[1].engine.clusterEvent(.head(1))
        #expect(b.takeResponses().isEmpty)
        cl.pump()
        let r = b.takeResponses()
        #expect(r.count == 1 && r[0]["seq"] == 1)
        // A `since` past this host's seq waits for the head too, then is answered as usual.
        a.post(#"{"op":"update","model":{"id":"A","v":2}}"#)
        cl.pump(readers: [0])
        b.post(#"{"rid":"r","op":"subscribe","sub":"x","ids":["A"],"since":2}"#)
        #expect(b.takeResponses().isEmpty)
        cl.pump()
        #expect(b.takeResponses().first?["ok"] == true)
    }
}
