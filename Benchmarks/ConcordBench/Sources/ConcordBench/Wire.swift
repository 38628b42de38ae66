import ConcordSocket
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Monotonic nanoseconds (shared by writer and readers of one process).
func nowNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

func seconds(since start: UInt64) -> Double { Double(nowNanos() - start) / 1e9 }

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// A blocking Unix-socket connection with a read buffer; one thread uses it at a time.
final class Conn: @unchecked Sendable {
    // Sendable: a connection is handed to exactly one thread at a time.
    let fd: Int32
    private var buf = [UInt8](repeating: 0, count: 1 << 20)
    private var reader: SocketLineReader

    init(_ path: String) throws {
        do { fd = try UnixSocket.connect(path) } catch { throw BenchError(error.description) }
        reader = SocketLineReader(fd: fd, capacity: 1 << 20)
        UnixSocket.setOption(fd, SO_RCVBUF, 4 << 20)
    }

    deinit { close(fd) }

    /// Ends the connection now (the server sees it close).
    func hangUp() { shutdown(fd, Int32(SHUT_RDWR)) }

    func write(_ bytes: [UInt8]) {
        var off = 0
        while off < bytes.count {
            let n = bytes[off...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            off += n
        }
    }

    func write(_ s: String) { write(Array(s.utf8)) }

    /// Reads whatever is available (blocking for at least one byte) and hands
    /// it to `body`; false at EOF.
    func readChunk(_ body: (UnsafeBufferPointer<UInt8>) -> Void) -> Bool {
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n <= 0 { return false }
        buf.withUnsafeBufferPointer { body(UnsafeBufferPointer(rebasing: $0[0..<n])) }
        return true
    }

    /// Next line (without "\n"), buffered.
    func readLine() -> [UInt8]? { reader.readLine() }

    /// Reads `n` lines (responses), discarding them.
    func skipLines(_ n: Int) {
        for _ in 0..<n { _ = readLine() }
    }

    func setTimeout(_ seconds: Double) {
        var tv = timeval(tv_sec: Int(seconds), tv_usec: Int((seconds - Double(Int(seconds))) * 1e6))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }
}

/// A Redis command in RESP.
func resp(_ parts: [String]) -> [UInt8] {
    var out = "*\(parts.count)\r\n"
    for p in parts { out += "$\(p.utf8.count)\r\n\(p)\r\n" }
    return Array(out.utf8)
}

/// Counts occurrences of `needle` in a byte stream split across chunks.
struct PatternCounter {
    let needle: [UInt8]
    private var matched = 0
    var count = 0

    init(_ s: String) { needle = Array(s.utf8) }

    mutating func feed(_ bytes: UnsafeBufferPointer<UInt8>) {
        for b in bytes {
            if b == needle[matched] {
                matched += 1
                if matched == needle.count {
                    count += 1
                    matched = 0
                }
            } else {
                matched = b == needle[0] ? 1 : 0
            }
        }
    }
}

/// Scans a stream for `"<key>":<digits>` and reports each number.
struct NumberScanner {
    private let key: [UInt8]
    private var matched = 0
    private var inNumber = false
    private var value: UInt64 = 0

    /// `member`: the member name, e.g. `t` for `"t":123`.
    init(_ member: String) { key = Array("\"\(member)\":".utf8) }

    mutating func feed(_ bytes: UnsafeBufferPointer<UInt8>, _ found: (UInt64) -> Void) {
        for b in bytes {
            if inNumber {
                if b >= 48 && b <= 57 {
                    value = value * 10 + UInt64(b - 48)
                    continue
                }
                found(value)
                inNumber = false
                value = 0
            }
            if b == key[matched] {
                matched += 1
                if matched == key.count {
                    inNumber = true
                    matched = 0
                }
            } else {
                matched = b == key[0] ? 1 : 0
            }
        }
    }
}

/// A child server process.
final class ServerProc {
    let process = Process()
    let socket: String

    init(_ path: String, _ args: [String], socket: String, waitSeconds: Double = 5) throws {
        self.socket = socket
        unlink(socket)
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = args
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        for _ in 0..<Int(waitSeconds * 100) {
            if (try? Conn(socket)) != nil { return }
            usleep(10_000)
        }
        throw BenchError("\(path) did not start listening on \(socket)")
    }

    var pid: Int32 { process.processIdentifier }

    /// Resident set size from /proc.
    var rssBytes: Int {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            let kb = line.split(separator: " ").compactMap { Int($0) }.first ?? 0
            return kb * 1024
        }
        return 0
    }

    func stop() {
        if process.isRunning {
            kill(pid, SIGTERM)
            for _ in 0..<300 where process.isRunning { usleep(10_000) }
            if process.isRunning { kill(pid, SIGKILL) }
        }
        process.waitUntilExit()
        unlink(socket)
    }
}
