import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A Unix-socket proxy in front of Redis that can make Redis refuse chosen
/// commands, the way it refuses them in states a test cannot hold open on
/// demand (`-LOADING` while it reads its files after a restart). It reads
/// the client's RESP commands one by one and forwards each unchanged,
/// except an armed one: that is replaced by an `EVAL` whose script returns
/// the chosen error, so Redis itself answers it, in order with the
/// commands around it. Replies pass through as bytes.
final class RESPFaultProxy: SocketProxy, @unchecked Sendable {
    // Sendable: `refusals` is behind `lock`, as the base class's state is.
    /// Command name (upper case) → (how many more to answer otherwise, the
    /// Lua script Redis runs instead, and a text its key must contain, if any).
    private var refusals: [String: (count: Int, script: String, key: String?)] = [:]
    /// Command names (upper case) armed to cut the connections after them,
    /// with a text the key must contain, if any.
    private var cuts: [String: (count: Int, key: String?)] = [:]
    /// Commands refused so far.
    let refused = Atomic<Int>(0)
    /// Armed cuts made so far (counted once the connections are cut).
    let cutsMade = Atomic<Int>(0)

    var url: String { "unix://" + path }

    init(target: String) throws {
        try super.init(target: target, suffix: ".faults")
    }

    /// The next `times` commands named `command` (e.g. `SCRIPT`) are answered
    /// with `error` (e.g. `LOADING Redis is loading the dataset in memory`)
    /// instead of being run; with `keyContaining`, only those whose first
    /// argument (the key) contains it (`SET` of a snapshot chunk, not of
    /// the lease).
    func refuse(_ command: String, times: Int, with error: String, keyContaining: String? = nil) {
        answer(command, times: times, withScript: "return redis.error_reply('\(error)')", keyContaining: keyContaining)
    }

    /// The next `times` commands named `command` are answered with what
    /// the Lua `script` returns instead of being run (`return {false}`: an
    /// array of one nil, as `MGET` of a key that is gone); `keyContaining`
    /// as in ``refuse(_:times:with:keyContaining:)``. Counted in `refused`.
    func answer(_ command: String, times: Int, withScript script: String, keyContaining: String? = nil) {
        lock.withLock { refusals[command.uppercased()] = (times, script, keyContaining) }
    }

    /// The next command named `command` goes to Redis and runs, but its
    /// answer is lost: the proxy drops Redis's replies on every connection
    /// (what the command wakes on the others is lost too), waits for Redis
    /// to have run it, and cuts every connection (what the client sent
    /// after it is never forwarded). With `keyContaining`, only a command
    /// whose key contains it.
    func cutAfter(_ command: String, keyContaining: String? = nil) {
        lock.withLock { cuts[command.uppercased()] = ((cuts[command.uppercased()]?.count ?? 0) + 1, keyContaining) }
    }

    /// No more faults: every armed refusal and cut is dropped.
    func calm() {
        lock.withLock {
            refusals = [:]
            cuts = [:]
        }
    }

    /// Client → Redis, command by command.
    override func pumpUp(client: Int32, server: Int32) {
        var pending: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buf.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return }
            pending.append(contentsOf: buf[0..<n])
            while let (args, length) = Self.command(in: pending) {
                var out = Array(pending[0..<length])
                pending.removeFirst(length)
                let name = args.first.map { String(decoding: $0, as: UTF8.self).uppercased() } ?? ""
                let key = args.count > 1 ? String(decoding: args[1], as: UTF8.self) : ""
                if takeCut(name, key: key) {
                    muteAll()
                    _ = Self.sendAll(server, out[...])
                    Thread.sleep(forTimeInterval: 0.1)  // Redis runs it; the answer is dropped
                    cutAll()
                    cutsMade.add(1, ordering: .relaxed)
                    return
                }
                if let script = takeRefusal(name, key: key) {
                    out = Self.encode(["EVAL", script, "0"])
                    refused.add(1, ordering: .relaxed)
                }
                guard Self.sendAll(server, out[...]) else { return }
            }
        }
    }

    private func takeCut(_ name: String, key: String) -> Bool {
        lock.withLock {
            guard let c = cuts[name], c.count > 0, c.key.map({ key.contains($0) }) ?? true else { return false }
            cuts[name] = (c.count - 1, c.key)
            return true
        }
    }

    private func takeRefusal(_ name: String, key: String) -> String? {
        lock.withLock {
            guard let r = refusals[name], r.count > 0, r.key.map({ key.contains($0) }) ?? true else { return nil }
            refusals[name] = (r.count - 1, r.script, r.key)
            return r.script
        }
    }

    /// The first complete command in `b` (a RESP array of bulk strings, as
    /// hiredis sends them): its arguments and its length in bytes; nil
    /// while it is incomplete.
    static func command(in b: [UInt8]) -> (args: [[UInt8]], length: Int)? {
        var i = 0
        func number(after marker: UInt8) -> Int? {
            guard i < b.count, b[i] == marker else { return nil }
            var j = i + 1
            var n = 0
            while j + 1 < b.count, b[j] != 0x0D {
                n = n * 10 + Int(b[j] - 0x30)
                j += 1
            }
            guard j + 1 < b.count, b[j + 1] == 0x0A else { return nil }
            i = j + 2
            return n
        }
        guard let count = number(after: UInt8(ascii: "*")) else { return nil }
        var args: [[UInt8]] = []
        for _ in 0..<count {
            guard let len = number(after: UInt8(ascii: "$")), i + len + 2 <= b.count else { return nil }
            args.append(Array(b[i..<(i + len)]))
            i += len + 2
        }
        return (args, i)
    }

    static func encode(_ args: [String]) -> [UInt8] {
        var out = Array("*\(args.count)\r\n".utf8)
        for a in args {
            out += Array("$\(a.utf8.count)\r\n".utf8) + Array(a.utf8) + [0x0D, 0x0A]
        }
        return out
    }
}
