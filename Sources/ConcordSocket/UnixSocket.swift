#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why a Unix-socket connection could not be made.
public struct UnixSocketError: Error, CustomStringConvertible, Sendable {
    /// The `errno` of the failing call (`ENAMETOOLONG` for a path that does not fit `sun_path`).
    public let code: Int32
    public let description: String
}

/// The one place in the tree that opens a client connection to a Unix
/// socket: the SDK, the CLI, the server's "is someone already listening"
/// probe, the test client and both load generators use it.
///
/// The descriptor is returned to the caller, who owns it and closes it
/// exactly once. On failure nothing stays open: the helper closes its own
/// descriptor before throwing, so a caller never closes a number that
/// another thread may have been given since (a double close of that kind
/// made a concurrently spawned test process fail with EBADF).
public enum UnixSocket {
    /// Connects a blocking `SOCK_STREAM` socket to `path` (close-on-exec).
    public static func connect(_ path: String) throws(UnixSocketError) -> Int32 {
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else {
            throw UnixSocketError(code: ENAMETOOLONG,
                                  description: "socket path too long (\(bytes.count) bytes, at most \(MemoryLayout.size(ofValue: addr.sun_path) - 1)): \(path)")
        }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else {
            let e = errno
            throw UnixSocketError(code: e, description: "socket() failed: \(String(cString: strerror(e)))")
        }
        var rc: Int32
        repeat {
            rc = withUnsafePointer(to: &addr) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connectCall(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
        } while rc != 0 && errno == EINTR
        guard rc == 0 else {
            let e = errno
            close(fd)
            throw UnixSocketError(code: e, description: "cannot connect to \(path): \(String(cString: strerror(e)))")
        }
        return fd
    }

    /// True when a process accepts connections on `path` right now.
    public static func someoneAnswers(_ path: String) -> Bool {
        guard let fd = try? connect(path) else { return false }
        close(fd)
        return true
    }

    /// Sets a receive timeout (`SO_RCVTIMEO`); reads then fail with EAGAIN instead of blocking forever.
    public static func setReceiveTimeout(_ fd: Int32, seconds: Double) {
        var tv = timeval(tv_sec: Int(seconds), tv_usec: Int((seconds - Double(Int(seconds))) * 1_000_000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    /// Sets an integer socket option (e.g. `SO_RCVBUF`, `SO_KEEPALIVE`).
    public static func setOption(_ fd: Int32, _ name: Int32, _ value: Int32) {
        var v = value
        setsockopt(fd, SOL_SOCKET, name, &v, socklen_t(MemoryLayout<Int32>.size))
    }
}

#if canImport(Glibc)
private let connectCall = Glibc.connect
#else
private let connectCall = Darwin.connect
#endif
