import ConcordJSON
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A real `concord-server` process on a temporary socket.
final class ServerProcess {
    let socketPath: String
    let process: Process
    let stderrURL: URL
    let dir: URL
    private let ownsDirectory: Bool

    /// The built server binary: next to the test bundle (`swift build` puts both in .build/<config>/),
    /// or `$CONCORD_SERVER_BIN`.
    static var binary: URL {
        if let p = ProcessInfo.processInfo.environment["CONCORD_SERVER_BIN"] { return URL(fileURLWithPath: p) }
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        return exe.deletingLastPathComponent().appendingPathComponent("concord-server")
    }

    /// `directory`: reuse another server's folder (same socket path), e.g. to restart it.
    /// `environment`: added to the test's own (e.g. `CONCORD_INTERNAL_CHECKS`).
    init(arguments: [String] = [], socketName: String = "s.sock", directory: URL? = nil,
         environment: [String: String] = [:]) throws {
        let bin = Self.binary
        guard FileManager.default.isExecutableFile(atPath: bin.path) else {
            throw TestFailure("concord-server not found at \(bin.path); run `swift build` first (make test does)")
        }
        dir = directory ?? URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("concord-\(UUID().uuidString.prefix(8))")
        ownsDirectory = directory == nil
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        socketPath = dir.appendingPathComponent(socketName).path
        stderrURL = dir.appendingPathComponent("stderr-\(UUID().uuidString.prefix(4)).log")
        FileManager.default.createFile(atPath: stderrURL.path, contents: nil)
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

    /// Starts a process on an existing socket path without waiting (for start-up failure tests).
    static func runToExit(arguments: [String], timeout: Double = 10) throws -> (status: Int32, stderr: String) {
        let p = Process()
        p.executableURL = binary
        p.arguments = arguments
        let pipe = Pipe()
        p.standardError = pipe
        p.standardOutput = FileHandle.nullDevice
        try p.run()
        let deadline = Date().addingTimeInterval(timeout)
        while p.isRunning && Date() < deadline { usleep(20_000) }
        if p.isRunning {
            p.terminate()
            throw TestFailure("server did not exit within \(timeout)s")
        }
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    private func waitForSocket() throws {
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            if let c = try? WireClient(path: socketPath) {
                c.close()
                return
            }
            if !process.isRunning { throw TestFailure("server exited at start-up: \(stderr)") }
            usleep(20_000)
        }
        throw TestFailure("server did not listen within 20s: \(stderr)")
    }

    var stderr: String { (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "" }

    func connect() throws -> WireClient { try WireClient(path: socketPath) }

    /// SIGTERM and wait; returns the exit status.
    @discardableResult
    func stop(timeout: Double = 10) -> Int32 {
        if process.isRunning { kill(process.processIdentifier, SIGTERM) }
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            return -1
        }
        return process.terminationStatus
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        if ownsDirectory { try? FileManager.default.removeItem(at: dir) }
    }
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// Set by `make sanitize` (thread or address): the processes run under a
/// sanitizer, which replaces jemalloc as the allocator, so jemalloc's figures
/// (`stats.memory`, `--memory-limit`) say nothing there.
/// The core's internal checks (Engine+Invariants.swift) for a spawned server:
/// after every request its indexes are checked against its records.
let internalChecks = ["CONCORD_INTERNAL_CHECKS": "1"]

enum Sanitizer {
    static var name: String? { ProcessInfo.processInfo.environment["CONCORD_SANITIZER"] }
    static var active: Bool { name != nil }
    static let jemallocReason: Comment = "depends on jemalloc's figures; a sanitizer replaces the allocator"
}
