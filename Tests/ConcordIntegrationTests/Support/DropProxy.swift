import ConcordSocket
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A Unix-socket proxy in front of a server that can cut a client's
/// connection at a chosen moment — after forwarding a request and before
/// its answer comes back — so a test can lose an answer the way a real
/// network would. Lines pass through unchanged otherwise.
final class DropProxy: @unchecked Sendable {
    // Sendable: `armed` and `open` are behind `lock`; the threads own their descriptors.
    // An NSLock (pthread mutex), not `Mutex`: ThreadSanitizer sees a pthread
    // mutex order the threads, and does not see the uninstrumented futex of
    // the standard library's `Mutex` (it reported the list's accesses here).
    let path: String
    private let target: String
    private let listener: Int32
    /// When set, the next client line containing this text is forwarded and
    /// that client connection is closed before anything more comes back.
    private let lock = NSLock()
    private var armed: String?
    private var open: [Int32] = []
    let drops = Atomic<Int>(0)

    init(target: String) throws {
        self.target = target
        path = target + ".proxy"
        unlink(path)
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { p in
            let bytes = Array(path.utf8)
            for (i, b) in bytes.enumerated() { p[i] = b }
        }
        let ok = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard ok == 0, listen(listener, 16) == 0 else { throw TestFailure("proxy: cannot listen on \(path)") }
        let t = Thread { [self] in acceptLoop() }
        t.start()
    }

    /// Cuts the connection that sends the next line containing `text`, right after forwarding it.
    func dropAfterForwarding(lineContaining text: String) { lock.withLock { armed = text } }

    /// Cuts every client connection now.
    func dropAll() {
        let fds = lock.withLock { () -> [Int32] in
            defer { open = [] }
            return open
        }
        for fd in fds { shutdown(fd, Int32(SHUT_RDWR)) }
        drops.add(fds.count, ordering: .relaxed)
    }

    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        dropAll()
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
            let up = Thread { [self] in pumpUp(client: client, server: server) }
            let down = Thread { [self] in pumpDown(server: server, client: client) }
            up.start()
            down.start()
        }
    }

    /// Client → server, line by line (so a line can be matched).
    private func pumpUp(client: Int32, server: Int32) {
        var reader = SocketLineReader(fd: client)
        while let line = reader.readLine() {
            var bytes = line
            bytes.append(0x0A)
            let text = String(decoding: line, as: UTF8.self)
            let cut = lock.withLock { () -> Bool in
                guard let t = armed, text.contains(t) else { return false }
                armed = nil
                return true
            }
            // The answer is lost: the client side is closed before the line
            // reaches the server, so nothing of its answer can get back.
            if cut { shutdown(client, Int32(SHUT_RDWR)) }
            _ = bytes.withUnsafeBytes { send(server, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if cut {
                drops.add(1, ordering: .relaxed)
                break
            }
        }
        shutdown(server, Int32(SHUT_RDWR))
    }

    /// Server → client, bytes as they come.
    private func pumpDown(server: Int32, client: Int32) {
        var buf = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buf.withUnsafeMutableBytes { recv(server, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            let sent = buf.withUnsafeBytes { send(client, $0.baseAddress, n, Int32(MSG_NOSIGNAL)) }
            if sent <= 0 { break }
        }
        shutdown(client, Int32(SHUT_RDWR))
        close(server)
        lock.withLock { open.removeAll { $0 == client } }
        close(client)
    }
}
