import ConcordJSON
import ConcordTestServer
import ConcordTestSupport
import Foundation
import Testing

/// Random faults between a cluster host and its log, through the RESP fault
/// proxy, while a writer writes one entity per request: Redis refusing a
/// command (`-LOADING`, `-OOM`, `-BUSY`, a few times running), running one
/// and losing its answer with every connection, or the connections cut.
/// Whatever the host answered must be true: "applied" writes are on both
/// hosts, "nothing was applied" ones are on neither (and their token's retry
/// is no duplicate), `indeterminate` ones are settled by their token's
/// retry; the two hosts end in the same state.
@Suite(.serialized, .enabled(if: RedisProcess.available, "needs /usr/bin/redis-server (make test installs it)"))
struct ClusterFaultSoakTests {
    /// Seconds of faults: 6, or 60 with CONCORD_SOAK=1. The seed is printed
    /// (CONCORD_FAULT_SEED=n repeats a run's choice of faults; their timing
    /// against the writer is the machine's).
    @Test func everyAnswerAHostGivesUnderRandomLogFaultsIsTrue() throws {
        let seconds = ProcessInfo.processInfo.environment["CONCORD_SOAK"] == nil ? 6.0 : 60.0
        let seed = UInt64(ProcessInfo.processInfo.environment["CONCORD_FAULT_SEED"] ?? "") ?? UInt64.random(in: 1...1_000_000)
        print("cluster fault soak: seed \(seed), \(seconds) s")
        var rng = SeededRandom(seed: seed)
        let pair = try ClusterTests.attachedHosts(proxyingTheFirst: true)
        let (proxy, faulty, other) = (pair.proxy!, pair.hosts[0], pair.hosts[1])
        defer { proxy.stop(); withExtendedLifetime(pair) {} }

        enum Answer { case applied(Int), notApplied, indeterminate, none }
        let answers = LockedList<(Int, Answer, String)>()
        let stop = Flag()
        let done = DispatchSemaphore(value: 0)
        let writer = try WireClient(path: faulty.socketPath, timeout: 30)
        let pause = UInt32(max(5_000, seconds * 1e6 / 2_000))
        Thread {
            var i = 0
            while !stop.isSet {
                let r: JSON
                do {
                    r = try writer.request(#"{"op":"update","model":{"id":"W:\#(i)","v":\#(i)},"token":"t\#(i)"}"#)
                } catch {
                    answers.append((i, .none, "\(error)"))
                    break
                }
                if let s = r["seq"]?.numberValue?.intValue, r["ok"] == true {
                    answers.append((i, .applied(s), ""))
                } else if r["error"]?["code"] == "unavailable" {
                    answers.append((i, r["error"]?["indeterminate"] == true ? .indeterminate : .notApplied, r.compactString))
                } else {
                    answers.append((i, .none, r.compactString))
                }
                i += 1
                // Paced, ~2,000 writes at most: the hosts run their internal
                // checks, which walk the whole state after every mutation.
                usleep(pause)
            }
            done.signal()
        }.start()

        let commands = ["EVALSHA", "XREAD", "HMGET", "HGET", "SCRIPT", "XRANGE"]
        let errors = ["LOADING Redis is loading the dataset in memory", "OOM command not allowed when used memory > maxmemory.",
                      "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."]
        var faults: [String: Int] = [:]
        let end = Date().addingTimeInterval(seconds)
        while Date() < end {
            switch rng.next() % 10 {
            case 0..<6:
                let c = commands[Int(rng.next() % UInt64(commands.count))]
                proxy.refuse(c, times: 1 + Int(rng.next() % 4), with: errors[Int(rng.next() % UInt64(errors.count))])
                faults["refuse \(c)", default: 0] += 1
            case 6..<9:
                let c = ["EVALSHA", "XREAD", "HMGET"][Int(rng.next() % 3)]
                proxy.cutAfter(c)
                faults["cut after \(c)", default: 0] += 1
            default:
                proxy.cutAll()
                faults["cut", default: 0] += 1
            }
            usleep(UInt32(300_000 + rng.next() % 600_000))
        }
        proxy.calm()
        stop.set()
        #expect(done.wait(timeout: .now() + 60) == .success, "the writer never got its last answer")
        // A cut made just before the calm may not have been seen yet: wait
        // out a reconnection before checking that both are attached.
        Thread.sleep(forTimeInterval: 1)
        try ClusterTests.waitAttached([faulty, other])
        let (a, b) = (pair.a, pair.b)
        for c in [a, b] { #expect(try c.request(#"{"op":"sync","timeout_ms":20000}"#)["ok"] == true) }

        let all = answers.all
        var counts: [String: Int] = [:]
        for (i, answer, text) in all {
            switch answer {
            case .applied(let s):
                counts["applied", default: 0] += 1
                let got = try b.request(#"{"op":"get","id":"W:\#(i)","min_seq":\#(s)}"#)
                #expect(got["model"]?["v"] == .int(i), "W:\(i) answered applied at seq \(s), the other host has \(got.compactString)")
            case .notApplied:
                counts["not applied", default: 0] += 1
                let got = try b.request(#"{"op":"get","id":"W:\#(i)"}"#)
                #expect(got["model"] == nil || got["model"] == .null, "W:\(i) answered not applied (\(text)), the other host has it: \(got.compactString)")
                let retry = try a.request(#"{"op":"update","model":{"id":"W:\#(i)","v":\#(i)},"token":"t\#(i)"}"#)
                #expect(retry["duplicate"] == nil, "W:\(i) answered not applied (\(text)), its token's retry is a duplicate: \(retry.compactString)")
            case .indeterminate, .none:
                if case .none = answer { counts["no answer", default: 0] += 1 } else { counts["indeterminate", default: 0] += 1 }
                let retry = try a.request(#"{"op":"update","model":{"id":"W:\#(i)","v":\#(i)},"token":"t\#(i)"}"#)
                #expect(retry["ok"] == true, "W:\(i)'s token retry: \(retry.compactString)")
            }
        }
        print("cluster fault soak: \(all.count) writes \(counts.sorted { $0.key < $1.key }), faults \(faults.sorted { $0.key < $1.key })")
        #expect(counts["applied", default: 0] > 0)
        // The two hosts hold the same: every write, after the retries.
        for c in [a, b] { #expect(try c.request(#"{"op":"sync","timeout_ms":20000}"#)["ok"] == true) }
        var views: [String] = []
        for c in [a, b] {
            var text = ""
            for (i, _, _) in all { text += try c.request(#"{"op":"get","id":"W:\#(i)"}"#)["model"]?.compactString ?? "absent" }
            views.append(text)
        }
        #expect(views[0] == views[1])
        #expect(!views[0].contains("absent"))
    }
}
