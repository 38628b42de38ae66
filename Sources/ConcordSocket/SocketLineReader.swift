#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Reads newline-terminated lines from a connected socket (blocking `recv`):
/// the one line reader of the tree's clients — the SDK's reader thread, the
/// CLI, the test client and both load generators.
///
/// Lines are handed out without their `\n`, as views into the reader's own
/// buffer (valid only inside the call) or as copies (``readLine()``). The
/// buffer grows to hold the longest line seen and is reused.
public struct SocketLineReader {
    /// The descriptor read from; the caller owns it and closes it.
    public let fd: Int32
    private var buffer: [UInt8]
    private var start = 0
    private var end = 0
    /// `errno` of the read that ended reading (0: the peer closed the connection).
    public private(set) var lastError: Int32 = 0

    /// A reader of `fd` with an initial buffer of `capacity` bytes.
    public init(fd: Int32, capacity: Int = 1 << 16) {
        self.fd = fd
        buffer = [UInt8](repeating: 0, count: max(capacity, 16))
    }

    /// Calls `line` for each complete line, in order, until it returns false
    /// (then returns true) or the connection ends (then returns false;
    /// ``lastError`` says why). `boundary` is called whenever every buffered
    /// line has been handed out and the reader is about to block for more
    /// (the SDK ends an event group there).
    @discardableResult
    public mutating func readLines(
        _ line: (UnsafeBufferPointer<UInt8>) throws -> Bool, boundary: () -> Void = {}
    ) rethrows -> Bool {
        while true {
            while let nl = buffer[start..<end].firstIndex(of: 0x0A) {
                let from = start
                start = nl + 1
                let keepGoing = try buffer.withUnsafeBufferPointer { try line(UnsafeBufferPointer(rebasing: $0[from..<nl])) }
                if !keepGoing { return true }
            }
            boundary()
            guard fill() else { return false }
        }
    }

    /// The next line (a copy, without its `\n`), or nil when the connection
    /// ended (``lastError``: 0 at end of stream, else the `errno`, such as
    /// `EAGAIN` after a receive timeout).
    public mutating func readLine() -> [UInt8]? {
        var out: [UInt8]?
        readLines { l in
            out = Array(l)
            return false
        }
        return out
    }

    /// One `recv` into the free end of the buffer (compacting or growing it first).
    private mutating func fill() -> Bool {
        if start > 0 {
            let n = end - start
            if n > 0 { buffer.withUnsafeMutableBytes { raw in _ = memmove(raw.baseAddress!, raw.baseAddress! + start, n) } }
            end = n
            start = 0
        }
        if end == buffer.count { buffer += [UInt8](repeating: 0, count: buffer.count) }
        var n: Int
        repeat {
            n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + end, $0.count - end, 0) }
        } while n < 0 && errno == EINTR
        if n <= 0 {
            lastError = n == 0 ? 0 : errno
            return false
        }
        end += n
        return true
    }
}
