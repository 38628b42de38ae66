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
final class DropProxy: SocketProxy, @unchecked Sendable {
    // Sendable: `armed` is behind `lock`, as the base class's state is.
    /// When set, the next client line containing this text is forwarded and
    /// that client connection is closed before anything more comes back.
    private var armed: String?
    let drops = Atomic<Int>(0)

    init(target: String) throws {
        try super.init(target: target, suffix: ".proxy")
    }

    /// Cuts the connection that sends the next line containing `text`, right after forwarding it.
    func dropAfterForwarding(lineContaining text: String) { lock.withLock { armed = text } }

    /// Cuts every client connection now.
    func dropAll() {
        drops.add(cutAll(), ordering: .relaxed)
    }

    /// Client → server, line by line (so a line can be matched).
    override func pumpUp(client: Int32, server: Int32) {
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
            _ = Self.sendAll(server, bytes[...])
            if cut {
                drops.add(1, ordering: .relaxed)
                break
            }
        }
    }
}
