import ConcordSocket
public import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A real `concord-server` process on a temporary socket, for tests.
///
/// ```swift
/// let server = try ConcordTestServer()
/// let client = try await ConcordClient.connect(socketPath: server.socketPath)
/// ```
///
/// The server runs until ``stop(timeout:)`` or until the object goes away
/// (then it is killed), and its temporary directory is removed with it. Its
/// standard error (the log) is in ``stderr``, readable after ``stop(timeout:)``
/// too. Hold it in a local or a test's property, not a global: a global
/// (top-level code) is never released, so its directory would stay.
///
/// The binary: `$CONCORD_SERVER_BIN`, else `concord-server` next to the
/// running test executable (`swift build` puts both in `.build/<config>/`
/// when the package builds the server), else the first one on `$PATH`.
public final class ConcordTestServer: @unchecked Sendable {
    // Sendable: every stored property is set once in init; `Process` is only
    // signalled and polled.
    public let socketPath: String
    public let process: Process
    /// The server's standard error (its log).
    public let stderrURL: URL
    /// The temporary directory holding the socket and the log.
    public let directory: URL
    private let ownsDirectory: Bool

    /// Why a server could not be started.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        public init(_ description: String) { self.description = description }
    }

    public static var binary: URL {
        let env = ProcessInfo.processInfo.environment
        if let p = env["CONCORD_SERVER_BIN"], !p.isEmpty { return URL(fileURLWithPath: p) }
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        let sibling = exe.deletingLastPathComponent().appendingPathComponent("concord-server")
        if FileManager.default.isExecutableFile(atPath: sibling.path) { return sibling }
        for dir in (env["PATH"] ?? "").split(separator: ":") {
            let candidate = URL(fileURLWithPath: String(dir)).appendingPathComponent("concord-server")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
        }
        return sibling
    }

    /// Starts a server and waits (up to 20 s) until it accepts connections.
    /// - Parameters:
    ///   - arguments: more `concord-server` options (`--socket` is set here).
    ///   - socketName: the socket's file name in the directory.
    ///   - directory: use this directory (the same socket path as an earlier
    ///     server, e.g. to restart it). A directory that already exists is
    ///     not removed; one this server creates is, as its own would be.
    ///   - environment: added to this process's environment.
    public init(arguments: [String] = [], socketName: String = "s.sock", directory: URL? = nil,
                environment: [String: String] = [:]) throws {
        let bin = Self.binary
        guard FileManager.default.isExecutableFile(atPath: bin.path) else {
            throw Failure("concord-server not found at \(bin.path): build it (swift build), put it on PATH, or set CONCORD_SERVER_BIN")
        }
        self.directory = directory ?? URL(fileURLWithPath: NSTemporaryDirectory())
            .appendingPathComponent("concord-\(UUID().uuidString.prefix(8))")
        // Whoever created the directory removes it: a restart in the
        // directory of a server already gone (which removed it) recreates it,
        // and left it behind.
        ownsDirectory = !FileManager.default.fileExists(atPath: self.directory.path)
        try FileManager.default.createDirectory(at: self.directory, withIntermediateDirectories: true)
        socketPath = self.directory.appendingPathComponent(socketName).path
        stderrURL = self.directory.appendingPathComponent("stderr-\(UUID().uuidString.prefix(4)).log")
        _ = FileManager.default.createFile(atPath: stderrURL.path, contents: nil)
        process = Process()
        process.executableURL = bin
        process.arguments = ["--socket", socketPath] + arguments
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        process.standardError = try FileHandle(forWritingTo: stderrURL)
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        try waitForSocket()
    }

    private func waitForSocket() throws {
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            if UnixSocket.someoneAnswers(socketPath) { return }
            if !process.isRunning { throw Failure("concord-server exited at start-up: \(stderr)") }
            usleep(20_000)
        }
        throw Failure("concord-server did not listen within 20 s: \(stderr)")
    }

    /// What the server has logged so far.
    public var stderr: String { (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "" }

    /// SIGTERM (a clean shutdown: everything read is answered and stored),
    /// then waits; SIGKILL after `timeout` seconds (by default 10, or 40
    /// when `CONCORD_SANITIZER` is set, as `make sanitize` sets it: a server
    /// built with a sanitizer runs ~10–20× slower, and answering a flood's
    /// backlog before it exits took longer than 10 s under TSan with a whole
    /// suite beside it). Returns the exit status (-1 when it had to be killed).
    @discardableResult
    public func stop(timeout: Double? = nil) -> Int32 {
        let timeout = timeout ?? (ProcessInfo.processInfo.environment["CONCORD_SANITIZER"] != nil ? 40 : 10)
        if process.isRunning { kill(process.processIdentifier, SIGTERM) }
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            waitBounded()
            return -1
        }
        return process.terminationStatus
    }

    /// SIGKILL, as a crash would (nothing more is stored).
    public func kill9() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        waitBounded()
    }

    /// Waits up to 10 s for Foundation to see the exit. Not `waitUntilExit`:
    /// once, under the address sanitizer, Foundation missed a child's exit
    /// (the server was a zombie nobody reaped) and `waitUntilExit` spun for
    /// ever, holding the whole test run; a test now fails instead.
    private func waitBounded() {
        let deadline = Date().addingTimeInterval(10)
        while process.isRunning && Date() < deadline { usleep(10_000) }
    }

    deinit {
        kill9()
        if ownsDirectory { try? FileManager.default.removeItem(at: directory) }
    }
}
