import ConcordClient
import ConcordTestServer
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// README.md's SDK snippet is this target's ReadmeSnippet.swift, and it works.
@Suite(.serialized)
struct ReadmeTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    /// The code between two marker lines of `text` (or between a ```swift
    /// fence that follows `<!-- snippet: … -->` and its closing fence).
    static func block(_ text: String, after begin: String, until end: String) -> String? {
        guard let b = text.range(of: begin) else { return nil }
        let rest = text[b.upperBound...]
        guard let e = rest.range(of: end) else { return nil }
        return rest[..<e.lowerBound].trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test func readmeShowsTheCompiledSnippet() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let source = try String(contentsOf: Self.root.appendingPathComponent("Tests/ConcordReadmeTests/ReadmeSnippet.swift"), encoding: .utf8)
        let inReadme = Self.block(readme, after: "<!-- snippet: Tests/ConcordReadmeTests/ReadmeSnippet.swift -->\n```swift", until: "```")
        let compiled = Self.block(source, after: "// README-SNIPPET-BEGIN", until: "// README-SNIPPET-END")
        #expect(inReadme != nil, "README.md has no snippet block")
        #expect(compiled != nil)
        #expect(inReadme == compiled, "README.md's SDK snippet differs from Tests/ConcordReadmeTests/ReadmeSnippet.swift")
    }

    @Test func readmeShowsTheCompiledReadModifyWriteSnippet() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let source = try String(contentsOf: Self.root.appendingPathComponent("Tests/ConcordReadmeTests/ReadmeSnippet.swift"), encoding: .utf8)
        let inReadme = Self.block(readme, after: "<!-- snippet: Tests/ConcordReadmeTests/ReadmeSnippet.swift#2 -->\n```swift", until: "```")
        let compiled = Self.block(source, after: "// README-SNIPPET-2-BEGIN", until: "// README-SNIPPET-2-END")
        #expect(inReadme != nil, "README.md has no read-modify-write snippet")
        #expect(inReadme == compiled, "README.md's read-modify-write snippet differs from ReadmeSnippet.swift")
    }

    /// Two clients increment one counter 100 times each with the README's loop: 200.
    @Test func theReadModifyWriteSnippetLosesNoIncrement() async throws {
        let server = try ConcordTestServer()
        let a = try await ConcordClient.connect(socketPath: server.socketPath)
        let b = try await ConcordClient.connect(socketPath: server.socketPath)
        async let x: Void = { for _ in 0..<100 { _ = try await increment(a, 1) } }()
        async let y: Void = { for _ in 0..<100 { _ = try await increment(b, 1) } }()
        _ = try await (x, y)
        #expect(try await increment(a, 1) == 201)
        a.close()
        b.close()
        #expect(server.stop() == 0)
    }

    @Test func theSnippetRunsAgainstARealServer() async throws {
        let server = try ConcordTestServer()
        #expect(try await senderAfterRename(socket: server.socketPath) == "Ann B.")
        #expect(server.stop() == 0)
    }
}
