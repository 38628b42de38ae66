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

    static func line(_ s: String) -> LineFramer.Frame { .line(Array(s.utf8)[...]) }

    /// The lines one read completes share one copy of it when they fill at
    /// least half of it, and are copied one by one when blank or skipped
    /// lines would make a shared copy hold more than twice their bytes.
    @Test func linesOfOneReadShareACopyOnlyWhenTheyFillIt() {
        var f = LineFramer(maxLineBytes: 32)
        var out: [LineFramer.Frame] = []
        f.feed(Array("a\r\nbc\nlast".utf8)) { out.append($0) }
        #expect(out == [Self.line("a"), Self.line("bc")])
        guard case .line(let a) = out[0], case .line(let bc) = out[1] else { Issue.record("not lines"); return }
        #expect(a.startIndex == 0 && bc.startIndex == 3)  // one array: "a\r\nbc\n"
        #expect(f.bufferedBytes == 4)

        out = []
        let blanks = String(repeating: "    \n", count: 20)
        f.feed(Array("\nx\n\(blanks)y\n".utf8)) { out.append($0) }
        #expect(out == [Self.line("last"), Self.line("x"), Self.line("y")])
        for case .line(let l) in out { #expect(l.startIndex == 0, "a line with blank lines around it is copied alone") }

        // Too long lines are skipped, so they do not count as shared either.
        var g = LineFramer(maxLineBytes: 8)
        out = []
        g.feed(Array("ok\n\(String(repeating: "z", count: 100))\nfine\n".utf8)) { out.append($0) }
        #expect(out == [Self.line("ok"), .tooLarge, Self.line("fine")])
        for case .line(let l) in out { #expect(l.startIndex == 0) }
    }

    /// A read completing many lines frames them in groups of 128 (their
    /// ends noted on the stack): every line comes out, in order, and the
    /// lines of one group share one array.
    @Test func aReadOfManyLinesFramesEveryLine() {
        var text = ""
        for i in 0..<1000 { text += i % 7 == 3 ? "  \n" : "x\(i)\n" }
        var f = LineFramer(maxLineBytes: 64)
        var out: [LineFramer.Frame] = []
        f.feed(Array((text + "tail").utf8)) { out.append($0) }
        let want = (0..<1000).filter { $0 % 7 != 3 }.map { Self.line("x\($0)") }
        #expect(out == want)
        // Line 128 (the first of the second group; blank lines count) starts its group's array.
        var starts: [Int] = []
        for case .line(let l) in out { starts.append(l.startIndex) }
        let firstOfSecondGroup = (0..<128).filter { $0 % 7 != 3 }.count
        #expect(starts[0] == 0 && starts[1] > 0 && starts[firstOfSecondGroup] == 0)
        out = []
        f.feed(Array("\n".utf8)) { out.append($0) }
        #expect(out == [Self.line("tail")])
    }

    @Test(arguments: [1, 2, 3, 5, 8, 13, 100])
    func splitsLinesWhateverTheChunking(chunk: Int) {
        let input = Array("a\nbc\r\n\n  \t\r\nd e\n\rf\npartial".utf8)
        #expect(Self.frames(input, chunk: chunk) == [Self.line("a"), Self.line("bc"), Self.line("d e"), Self.line("\rf")])
    }

    /// Newlines at every offset within a word of eight, among bytes that
    /// differ from a newline in one bit (0x0B, 0x8A, 0x0E, …): the framer
    /// looks eight bytes at a time, and must find exactly the first one.
    @Test(arguments: [1, 7, 8, 9, 61, 4096])
    func findsEveryNewlineWhereverItFalls(chunk: Int) {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15 &* UInt64(chunk)
        func next() -> Int {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            return Int(truncatingIfNeeded: state >> 33)
        }
        let near: [UInt8] = [0x0B, 0x08, 0x8A, 0x0E, 0x1A, 0x2A, 0x4A, 0xFA, 0x41, 0x7B]
        var input: [UInt8] = []
        var want: [LineFramer.Frame] = []
        for _ in 0..<400 {
            let n = 1 + next() % 40
            let body = (0..<n).map { _ in near[next() % near.count] }
            input += body + [0x0A]
            want.append(.line(body[...]))
        }
        #expect(Self.frames(input, chunk: chunk, max: 64) == want)
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
