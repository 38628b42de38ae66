import ConcordJSON
import ConcordSocket
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A blocking line client over a Unix socket, for black-box tests.
/// Reads time out (default 10 s) instead of hanging a test.
final class WireClient: @unchecked Sendable {
    // Sendable: a client is used by one thread at a time (tests hand it over, never share it).
    let fd: Int32
    private var reader: SocketLineReader
    /// Events read while waiting for responses, in arrival order.
    var events: [JSON] = []
    private let parser = JSONParser(maxDepth: 100_000)

    init(path: String, timeout: Double = 10) throws {
        do { fd = try UnixSocket.connect(path) } catch { throw TestFailure(error.description) }
        reader = SocketLineReader(fd: fd)
        setTimeout(timeout)
    }

    func setTimeout(_ seconds: Double) {
        UnixSocket.setReceiveTimeout(fd, seconds: seconds)
    }

    private var closed = false
    private let closeLock = NSLock()

    /// Closes once: a second close could shut a descriptor number another
    /// test (suites run in parallel) has been given since.
    func close() {
        closeLock.lock()
        defer { closeLock.unlock() }
        guard !closed else { return }
        closed = true
        Glibc.close(fd)
    }

    deinit { close() }

    func write(_ bytes: [UInt8]) throws {
        var off = 0
        while off < bytes.count {
            let n = bytes[off...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { throw TestFailure("send failed: errno \(errno)") }
            off += n
        }
    }

    func write(_ s: String) throws { try write(Array(s.utf8)) }

    /// Sends one request line.
    func send(_ line: String) throws { try write(line + "\n") }

    /// The next line from the server, or nil at EOF.
    func readLine() throws -> [UInt8]? {
        if let line = reader.readLine() { return line }
        if reader.lastError != 0 { throw TestFailure("read failed or timed out: errno \(reader.lastError)") }
        return nil
    }

    func readJSON() throws -> JSON? {
        guard let line = try readLine() else { return nil }
        return try parser.parse(line)
    }

    /// Reads until the next response; events on the way are kept in `events`.
    func response() throws -> JSON {
        while true {
            guard let v = try readJSON() else { throw TestFailure("connection closed while waiting for a response") }
            if v["event"] != nil { events.append(v) } else { return v }
        }
    }

    /// Sends a request and returns its response.
    @discardableResult
    func request(_ line: String) throws -> JSON {
        try send(line)
        return try response()
    }

    /// Takes the events collected so far.
    func take() -> [JSON] {
        defer { events = [] }
        return events
    }
}
