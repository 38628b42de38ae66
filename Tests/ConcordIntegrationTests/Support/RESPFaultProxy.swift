import ConcordSocket
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
final class RESPFaultProxy: @unchecked Sendable {
    // Sendable: `refusals` and `open` are behind `lock` (an NSLock, as in
    // `DropProxy`: ThreadSanitizer sees a pthread mutex order the threads);
    // the threads own their descriptors.
    let path: String
    private let target: String
    private let listener: Int32
    private let lock = NSLock()
    /// Command name (upper case) → (how many more to refuse, the error).
    private var refusals: [String: (count: Int, error: String)] = [:]
    private var open: [Int32] = []
    /// Commands refused so far.
    let refused = Atomic<Int>(0)

    var url: String { "unix://" + path }

    init(target: String) throws {
        self.target = target
        path = target + ".faults"
        unlink(path)
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { p in
            for (i, b) in Array(path.utf8).enumerated() { p[i] = b }
        }
        let ok = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard ok == 0, listen(listener, 16) == 0 else { throw TestFailure("RESP proxy: cannot listen on \(path)") }
        let t = Thread { [self] in acceptLoop() }
        t.start()
    }

    /// The next `times` commands named `command` (e.g. `SCRIPT`) are answered
    /// with `error` (e.g. `LOADING Redis is loading the dataset in memory`)
    /// instead of being run.
    func refuse(_ command: String, times: Int, with error: String) {
        lock.withLock { refusals[command.uppercased()] = (times, error) }
    }

    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        let fds = lock.withLock { () -> [Int32] in
            defer { open = [] }
            return open
        }
        for fd in fds { shutdown(fd, Int32(SHUT_RDWR)) }
        unlink(path)
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 { return }
            guard let server = try? UnixSocket.connect(target) else {
                close(client)
                continue
            }
            lock.withLock { open.append(client) }
            Thread { [self] in pumpUp(client: client, server: server) }.start()
            Thread { [self] in pumpDown(server: server, client: client) }.start()
        }
    }

    /// Client → Redis, command by command.
    private func pumpUp(client: Int32, server: Int32) {
        var pending: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 1 << 16)
        reading: while true {
            let n = buf.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            pending.append(contentsOf: buf[0..<n])
            while let (args, length) = Self.command(in: pending) {
                var out = Array(pending[0..<length])
                pending.removeFirst(length)
                if let name = args.first.map({ String(decoding: $0, as: UTF8.self).uppercased() }), let error = takeRefusal(name) {
                    out = Self.encode(["EVAL", "return redis.error_reply('\(error)')", "0"])
                    refused.add(1, ordering: .relaxed)
                }
                guard Self.sendAll(server, out) else { break reading }
            }
        }
        shutdown(server, Int32(SHUT_RDWR))
    }

    private func takeRefusal(_ name: String) -> String? {
        lock.withLock {
            guard let r = refusals[name], r.count > 0 else { return nil }
            refusals[name] = (r.count - 1, r.error)
            return r.error
        }
    }

    /// Redis → client, bytes as they come.
    private func pumpDown(server: Int32, client: Int32) {
        var buf = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buf.withUnsafeMutableBytes { recv(server, $0.baseAddress, $0.count, 0) }
            if n <= 0 || !Self.sendAll(client, Array(buf[0..<n])) { break }
        }
        shutdown(client, Int32(SHUT_RDWR))
        close(server)
        lock.withLock { open.removeAll { $0 == client } }
        close(client)
    }

    private static func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return false }
            off += n
        }
        return true
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
