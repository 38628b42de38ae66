#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Where the server listens and clients connect when not told otherwise:
/// `$CONCORD_SOCKET`, else `$XDG_RUNTIME_DIR/concord/concord.sock`, else
/// `/tmp/concord-<uid>/concord.sock`. The directory is private to the user
/// (the server creates it 0700 and refuses it when another user could write
/// it), so no other local user can bind the path first and receive every
/// client's traffic — which a fixed `/tmp/concord.sock` would allow.
public enum DefaultSocket {
    /// `$CONCORD_SOCKET`, else `$XDG_RUNTIME_DIR/concord/concord.sock`, else `/tmp/concord-<uid>/concord.sock`.
    public static var path: String {
        if let p = environment("CONCORD_SOCKET"), !p.isEmpty { return p }
        return privateDirectory + "/concord.sock"
    }

    /// The per-user directory of the default socket.
    public static var privateDirectory: String {
        if let d = environment("XDG_RUNTIME_DIR"), !d.isEmpty { return d + "/concord" }
        return "/tmp/concord-\(getuid())"
    }

    static func environment(_ name: String) -> String? {
        guard let v = getenv(name) else { return nil }
        return String(cString: v)
    }
}
