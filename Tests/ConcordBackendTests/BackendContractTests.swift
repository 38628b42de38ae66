import ConcordJSON
import ConcordServer
import ConcordTestSupport
import Foundation
import Logging
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// One contract every backend passes, whatever its language.
/// The plugins are the ones `swift build` put next to the test binary.
@Suite(.serialized)
struct BackendContractTests {
    static let logger = Logger(label: "concord.test")

    static func tempDir() -> String {
        TestDirectories.make("concord-backend")
    }

    static func open(_ spec: String, _ config: String = "{}") throws -> Backend {
        do { return try Backend.open(spec: spec, configJSON: config, logger: logger) } catch {
            throw TestError("\(error)")
        }
    }

    static func configs() -> [(String, String)] {
        [("memory", "{}"), ("hash", "{}"), ("sqlite", #"{"path":"\#(tempDir())/c.sqlite"}"#)]
    }

    @Test(arguments: ["memory", "hash", "sqlite"])
    func putGetOverwriteDelete(spec: String) throws {
        let b = try Self.open(spec, Self.configs().first { $0.0 == spec }!.1)
        defer { b.close() }
        let k = Array("e:Person:1".utf8)
        #expect(try b.get(k) == nil)
        try b.put(k, Array("v1".utf8))
        #expect(try b.get(k) == Array("v1".utf8))
        try b.put(k, Array("version two".utf8))
        #expect(try b.get(k) == Array("version two".utf8))
        try b.delete(k)
        #expect(try b.get(k) == nil)
        try b.delete(k)  // deleting a missing key is fine
    }

    /// `scan` lists exactly the live records under a prefix (what a live
    /// query over a type reads when the backend may hold more than memory).
    @Test(arguments: ["memory", "hash", "sqlite"])
    func scanListsExactlyThePrefix(spec: String) throws {
        let b = try Self.open(spec, Self.configs().first { $0.0 == spec }!.1)
        defer { b.close() }
        #expect(b.canScan)
        for i in 0..<50 { try b.put(Array("e:Post:\(i)".utf8), Array("p\(i)".utf8)) }
        try b.put(Array("e:Posting:1".utf8), Array("other".utf8))
        try b.put(Array("e:Person:1".utf8), Array("x".utf8))
        try b.put(Array("d:e:Post:1".utf8), Array("doc".utf8))
        try b.put([0x65, 0x3A, 0xFF, 0xFF], [1])   // a prefix ending in 0xFF bytes
        try b.delete(Array("e:Post:7".utf8))
        let listed = try #require(try b.scan(prefix: Array("e:Post:".utf8)))
        let keys = Set(listed.map { String(decoding: $0.key, as: UTF8.self) })
        #expect(keys == Set((0..<50).filter { $0 != 7 }.map { "e:Post:\($0)" }))
        #expect(listed.allSatisfy { String(decoding: $0.value, as: UTF8.self) == "p" + String(decoding: $0.key.dropFirst(7), as: UTF8.self) })
        #expect(try b.scan(prefix: [0x65, 0x3A, 0xFF])?.map(\.key) == [[0x65, 0x3A, 0xFF, 0xFF]])
        #expect(try b.scan(prefix: Array("e:Nothing:".utf8))?.isEmpty == true)
    }

    @Test(arguments: ["memory", "hash", "sqlite"])
    func binaryKeysEmptyAndLargeValues(spec: String) throws {
        let b = try Self.open(spec, Self.configs().first { $0.0 == spec }!.1)
        defer { b.close() }
        let k: [UInt8] = [0, 1, 2, 0, 255]
        try b.put(k, [])
        #expect(try b.get(k) == [])
        let big = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        try b.put([9, 0, 9], big)
        #expect(try b.get([9, 0, 9]) == big)
        #expect(try b.get([0, 1, 2, 0]) == nil)
    }

    @Test(arguments: ["memory", "hash", "sqlite"])
    func batchesApplyInOrderAndClearEmpties(spec: String) throws {
        let b = try Self.open(spec, Self.configs().first { $0.0 == spec }!.1)
        defer { b.close() }
        try b.put(Array("gone".utf8), Array("x".utf8))
        var writes: [(key: [UInt8], value: [UInt8]?)] = []
        for i in 0..<500 { writes.append((Array("k\(i)".utf8), Array("v\(i)".utf8))) }
        writes.append((Array("k7".utf8), Array("last".utf8)))
        writes.append((Array("gone".utf8), nil))
        try b.writeBatch(writes)
        #expect(try b.get(Array("k7".utf8)) == Array("last".utf8))
        #expect(try b.get(Array("k499".utf8)) == Array("v499".utf8))
        #expect(try b.get(Array("gone".utf8)) == nil)
        let stats = b.stats()
        #expect(stats["items"]?.numberValue?.intValue == 500)
        try b.clear()
        #expect(try b.get(Array("k1".utf8)) == nil)
        #expect(b.stats()["items"]?.numberValue?.intValue == 0)
    }

    @Test func memoryBackendHoldsItsByteBoundWithLRU() throws {
        let b = try Self.open("memory", #"{"max_bytes":100000}"#)
        defer { b.close() }
        let value = [UInt8](repeating: 7, count: 1000)
        for i in 0..<1000 {
            try b.put(Array("k\(i)".utf8), value)
            if i == 10 { _ = try b.get(Array("k0".utf8)) }  // k0 recently used
        }
        let s = b.stats()
        #expect((s["bytes"]?.numberValue?.intValue ?? .max) <= 100_000)
        #expect((s["evictions"]?.numberValue?.intValue ?? 0) > 0)
        #expect(try b.get(Array("k999".utf8)) == value)
        #expect(try b.get(Array("k1".utf8)) == nil)
    }

    @Test func memoryBackendExpiresByAge() throws {
        let b = try Self.open("memory", #"{"ttl_ms":50}"#)
        defer { b.close() }
        try b.put(Array("k".utf8), Array("v".utf8))
        #expect(try b.get(Array("k".utf8)) != nil)
        // Expiry is about time: poll (well past the 50 ms TTL) instead of one fixed sleep.
        let deadline = Date().addingTimeInterval(5)
        while try b.get(Array("k".utf8)) != nil && Date() < deadline { usleep(10_000) }
        #expect(try b.get(Array("k".utf8)) == nil)
    }

    @Test func sqliteSurvivesReopenAndHoldsItsBound() throws {
        let path = Self.tempDir() + "/c.sqlite"
        do {
            let b = try Self.open("sqlite", #"{"path":"\#(path)","max_bytes":200000}"#)
            for i in 0..<1000 { try b.put(Array("k\(i)".utf8), [UInt8](repeating: 1, count: 1000)) }
            let s = b.stats()
            #expect((s["bytes"]?.numberValue?.intValue ?? .max) <= 200_000)
            #expect((s["evictions"]?.numberValue?.intValue ?? 0) > 0)
            try b.put(Array("keep".utf8), Array("me".utf8))
            b.close()
        }
        let b = try Self.open("sqlite", #"{"path":"\#(path)","max_bytes":200000}"#)
        defer { b.close() }
        #expect(try b.get(Array("keep".utf8)) == Array("me".utf8))
        #expect(try b.get(Array("k999".utf8)) != nil)
        #expect(try b.get(Array("k0".utf8)) == nil)
    }

    @Test(arguments: ["garbage", "truncated"])
    func sqliteMovesAnUnreadableFileAsideAndStartsEmpty(kind: String) throws {
        let dir = Self.tempDir()
        let path = dir + "/c.sqlite"
        if kind == "garbage" {
            #expect(FileManager.default.createFile(atPath: path, contents: Data(repeating: 0x5A, count: 8192)))
        } else {
            let b = try Self.open("sqlite", #"{"path":"\#(path)"}"#)
            for i in 0..<2000 { try b.put(Array("k\(i)".utf8), [UInt8](repeating: 3, count: 500)) }
            b.close()
            let h = FileHandle(forUpdatingAtPath: path)!
            try h.truncate(atOffset: 4096 + 100)
            try h.close()
            // Scribble over a b-tree page too.
            let w = FileHandle(forUpdatingAtPath: path)!
            try w.seek(toOffset: 1024)
            w.write(Data(repeating: 0xFF, count: 2048))
            try w.close()
        }
        let b = try Self.open("sqlite", #"{"path":"\#(path)"}"#)
        defer { b.close() }
        try b.put(Array("fresh".utf8), Array("ok".utf8))
        #expect(try b.get(Array("fresh".utf8)) == Array("ok".utf8))
        let names = try FileManager.default.contentsOfDirectory(atPath: dir)
        #expect(names.contains { $0.hasPrefix("c.sqlite.corrupt-") })
    }

    // MARK: Loading failures: one clear error each, never a crash

    func loadError(_ spec: String, _ config: String = "{}") -> String {
        do {
            let b = try Backend.open(spec: spec, configJSON: config, logger: Self.logger)
            b.close()
            return ""
        } catch {
            return error.description
        }
    }

    @Test func missingFile() {
        let e = loadError("/nonexistent/libnothing.so")
        #expect(e.contains("no such file") && e.contains("/nonexistent/libnothing.so"))
    }

    @Test func notALibrary() throws {
        let path = Self.tempDir() + "/libjunk.so"
        #expect(FileManager.default.createFile(atPath: path, contents: Data("not elf".utf8)))
        let e = loadError(path)
        #expect(e.contains("cannot load") && e.contains(path))
    }

    @Test func missingEntrySymbol() throws {
        let path = try CPlugin.build("int unrelated(void) { return 1; }")
        let e = loadError(path)
        #expect(e.contains("concord_backend_entry"))
    }

    @Test func wrongABIVersion() throws {
        let path = try CPlugin.build(CPlugin.table(version: 99))
        let e = loadError(path)
        #expect(e.contains("ABI version 99"))
    }

    @Test func openFailure() throws {
        let e = loadError("sqlite", #"{"path":"/nonexistent-dir/x/c.sqlite"}"#)
        #expect(e.contains("open failed"))
        let e2 = loadError("memory", #"{"max_bytes":"lots"}"#)
        #expect(e2.contains("max_bytes"))
    }
}

struct TestError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

/// Builds tiny C libraries with gcc for the loader's failure cases.
enum CPlugin {
    static func build(_ source: String) throws -> String {
        let dir = BackendContractTests.tempDir()
        let c = dir + "/p.c"
        let so = dir + "/libp.so"
        try source.write(toFile: c, atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/gcc")
        p.arguments = ["-shared", "-fPIC", "-o", so, c]
        try p.run()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else { throw TestError("gcc failed") }
        return so
    }

    static func table(version: Int) -> String {
        """
        #include <stddef.h>
        #include <stdint.h>
        struct api { uint32_t abi_version; uint32_t struct_size; const char *name; void *fns[9]; };
        static struct api t = { \(version), sizeof(struct api), "old", {0} };
        const struct api *concord_backend_entry(void) { return &t; }
        """
    }
}
