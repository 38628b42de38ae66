import ConcordSocket
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A Unix-socket proxy in front of a server, for tests that make the path
/// between a client and its server misbehave: it listens on `path`, opens
/// a connection to `target` for each client, and runs two threads per
/// pair — `pumpUp` (client → server, what a subclass inspects or changes)
/// and the server → client pump here (bytes as they come).
class SocketProxy: @unchecked Sendable {
    // Sendable: `open` (and a subclass's own state) is behind `lock`; the
    // threads own their descriptors. An NSLock (pthread mutex), not `Mutex`:
    // ThreadSanitizer sees a pthread mutex order the threads, and does not
    // see the uninstrumented futex of the standard library's `Mutex` (it
    // reported the list's accesses here).
    let path: String
    let lock = NSLock()
    private let target: String
    private let listener: Int32
    private var open: [Int32] = []
    /// Client connections whose server replies are dropped, not passed on.
    private var muted: Set<Int32> = []

    init(target: String, suffix: String) throws {
        self.target = target
        path = target + suffix
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
        guard ok == 0, listen(listener, 16) == 0 else { throw TestFailure("proxy: cannot listen on \(path)") }
        let t = Thread { [self] in acceptLoop() }
        t.start()
    }

    /// Client → server; returns when either side is done. Subclasses override.
    func pumpUp(client: Int32, server: Int32) {}

    /// The server's replies on every client connection are dropped from
    /// now on (commands still go through): answers lost on the way back,
    /// until the connections are cut.
    func muteAll() {
        lock.withLock { muted.formUnion(open) }
    }

    /// Cuts every client connection now; how many there were.
    @discardableResult
    func cutAll() -> Int {
        let fds = lock.withLock { () -> [Int32] in
            defer { open = [] }
            return open
        }
        for fd in fds { shutdown(fd, Int32(SHUT_RDWR)) }
        return fds.count
    }

    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        cutAll()
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
            let up = Thread { [self] in
                pumpUp(client: client, server: server)
                shutdown(server, Int32(SHUT_RDWR))
            }
            let down = Thread { [self] in pumpDown(server: server, client: client) }
            up.start()
            down.start()
        }
    }

    /// Server → client, bytes as they come.
    private func pumpDown(server: Int32, client: Int32) {
        var buf = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buf.withUnsafeMutableBytes { recv(server, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            if lock.withLock({ muted.contains(client) }) { continue }
            if !Self.sendAll(client, buf[0..<n]) { break }
        }
        shutdown(client, Int32(SHUT_RDWR))
        close(server)
        lock.withLock {
            open.removeAll { $0 == client }
            muted.remove(client)
        }
        close(client)
    }

    /// All of `bytes`, or false when the peer is gone.
    static func sendAll(_ fd: Int32, _ bytes: ArraySlice<UInt8>) -> Bool {
        var off = bytes.startIndex
        while off < bytes.endIndex {
            let n = bytes[off...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return false }
            off += n
        }
        return true
    }
}
