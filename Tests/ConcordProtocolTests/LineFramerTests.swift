import Testing

@testable import ConcordProtocol

struct LineFramerTests {
    static func frames(_ input: [UInt8], chunk: Int, max: Int = 32) -> [LineFramer.Frame] {
        var f = LineFramer(maxLineBytes: max)
        var out: [LineFramer.Frame] = []
        var i = 0
        while i < input.count {
            f.feed(Array(input[i..<min(i + chunk, input.count)])) { out.append($0) }
            i += chunk
        }
        return out
    }

    static func line(_ s: String) -> LineFramer.Frame { .line(Array(s.utf8)) }

    @Test(arguments: [1, 2, 3, 5, 8, 13, 100])
    func splitsLinesWhateverTheChunking(chunk: Int) {
        let input = Array("a\nbc\r\n\n  \t\r\nd e\n\rf\npartial".utf8)
        #expect(Self.frames(input, chunk: chunk) == [Self.line("a"), Self.line("bc"), Self.line("d e"), Self.line("\rf")])
    }

    @Test(arguments: [1, 4, 7, 64])
    func tooLongLinesAreReportedOnceAndSkipped(chunk: Int) {
        let long = String(repeating: "x", count: 100)
        let input = Array("ok\n\(long)\nnext\n".utf8)
        #expect(Self.frames(input, chunk: chunk) == [Self.line("ok"), .tooLarge, Self.line("next")])
    }

    @Test(arguments: [1, 3, 64])
    func theLimitExcludesTheLineEnding(chunk: Int) {
        let exact = String(repeating: "y", count: 32)
        let over = String(repeating: "z", count: 33)
        let input = Array("\(exact)\r\n\(exact)\n\(over)\r\n".utf8)
        #expect(Self.frames(input, chunk: chunk) == [Self.line(exact), Self.line(exact), .tooLarge])
    }

    @Test func aSkippedLineIsNotBuffered() {
        var f = LineFramer(maxLineBytes: 16)
        var out: [LineFramer.Frame] = []
        for _ in 0..<1000 { f.feed(Array(repeating: UInt8(ascii: "q"), count: 1000)) { out.append($0) } }
        #expect(out == [.tooLarge])
        #expect(f.bufferedBytes == 0)
        f.feed(Array("\nz\n".utf8)) { out.append($0) }
        #expect(out == [.tooLarge, Self.line("z")])
    }
}
