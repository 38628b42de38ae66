import ConcordJSON
import ConcordTestServer
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The integration tests' server: the SDK's ``ConcordTestServer`` (what SDK
/// users start in their own tests), with the raw-protocol helpers below.
typealias ServerProcess = ConcordTestServer

extension ConcordTestServer {
    var dir: URL { directory }

    func connect() throws -> WireClient { try WireClient(path: socketPath) }

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
}

/// Polls `condition` every 20 ms until it holds; throws after `timeout`
/// seconds. Tests wait for things this way, never with a fixed sleep.
func waitUntil(_ what: String, timeout: Double = 15, _ condition: () throws -> Bool) throws {
    // Waits for progress, not for speed: under a sanitizer the servers run
    // ~10–20× slower (a cluster host catching up on 9,000 log entries took
    // 29.7 s under TSan, 1.9 s in a debug build), so the wait is four times
    // as long there.
    let timeout = Sanitizer.active ? timeout * 4 : timeout
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try condition() { return }
        usleep(20_000)
    }
    if try condition() { return }
    throw TestFailure("timed out after \(timeout) s waiting for \(what)")
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
