import ConcordTestServer
import Foundation
import Testing

/// docs/OPERATIONS.md says it lists every option: hold it to that.
struct OptionsDocTests {
    /// The long options `concord-server --help` prints.
    static func serverOptions() throws -> Set<String> {
        let p = Process()
        p.executableURL = ConcordTestServer.binary
        p.arguments = ["--help"]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        let regex = try Regex("--[a-z][a-z0-9-]+")
        var options = Set(text.matches(of: regex).map { String(text[$0.range]) })
        options.remove("--help")
        return options
    }

    @Test func operationsGuideListsEveryServerOption() throws {
        let options = try Self.serverOptions()
        #expect(options.count > 20, "concord-server --help printed \(options.count) options; the parse is wrong")
        let docs = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/OPERATIONS.md")
        let text = try String(contentsOf: docs, encoding: .utf8)
        // The table's first column names each option in backticks.
        let missing = options.filter { !text.contains("`\($0)`") }.sorted()
        #expect(missing.isEmpty, "docs/OPERATIONS.md's option table does not list: \(missing.joined(separator: ", "))")
    }
}
