import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Temporary directories of one test process, all under one directory that
/// goes when the process exits. Tests that make paths (a database file for
/// a server to open, a backend's directory) rather than objects that clean
/// up after themselves left ~34 directories in `/tmp` per run.
public enum TestDirectories {
    /// `$TMPDIR/concord-tests-<pid>`, removed at exit.
    public static let root: String = {
        let r = NSTemporaryDirectory() + "concord-tests-\(getpid())"
        try? FileManager.default.createDirectory(atPath: r, withIntermediateDirectories: true)
        atexit { try? FileManager.default.removeItem(atPath: TestDirectories.root) }
        return r
    }()

    /// A new directory under ``root``, named `prefix-XXXXXXXX`.
    public static func make(_ prefix: String) -> String {
        let d = root + "/" + prefix + "-" + UUID().uuidString.prefix(8)
        try? FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true)
        return d
    }
}
