#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A top-level object read one member at a time, for a caller that wants a
/// few named members of a line without the object's tree: the names are
/// byte ranges, and only the values asked for are parsed (as trees, by the
/// tree parser's own code, with the thread's tables).
///
/// It reads only the regular form — the bytes ``JSONWriter`` writes: no
/// whitespace between the object's tokens, names of printable ASCII
/// without escapes. Anything else stops it (``nextName()`` returns nil
/// with ``finished`` false), and the caller parses the line as usual: the
/// reader never decides that a line is wrong, so a caller that falls back
/// on every doubt answers exactly what the full parse answers.
public struct JSONMemberReader {
    var state: ParserState
    var started = false
    /// The object's closing brace was read, and it is the input's last byte.
    public private(set) var finished = false

    init(state: ParserState) { self.state = state }

    /// The next member's name (its bytes between the quotes), positioned on
    /// its value; nil at the object's end (``finished``) or where the bytes
    /// are not the regular form.
    public mutating func nextName() -> UnsafeBufferPointer<UInt8>? {
        let buf = state.buf
        var p = state.pos
        guard p < buf.count, !finished else { return nil }
        if buf[p] == UInt8(ascii: "}") {
            state.pos = p &+ 1
            finished = state.pos == buf.count
            return nil
        }
        if started {
            guard buf[p] == UInt8(ascii: ",") else { return nil }
            p &+= 1
        }
        guard p < buf.count, buf[p] == UInt8(ascii: "\"") else { return nil }
        let start = p &+ 1
        var q = start
        while q < buf.count {
            let c = buf[q]
            if c == UInt8(ascii: "\"") { break }
            if c < 0x20 || c >= 0x7F || c == UInt8(ascii: "\\") { return nil }
            q &+= 1
        }
        guard q &+ 1 < buf.count, buf[q &+ 1] == UInt8(ascii: ":") else { return nil }
        state.pos = q &+ 2
        started = true
        return UnsafeBufferPointer(rebasing: buf[start ..< q])
    }

    /// The value of the member whose name was just read, parsed as the tree
    /// parser parses a member of a top-level object (same depth, same
    /// tables, same errors); `range` is where its bytes lie, and `regular`
    /// whether they are exactly what ``JSONWriter`` writes for it.
    public mutating func value() throws(JSONParseError) -> (value: JSON, range: Range<Int>, regular: Bool) {
        let start = state.pos, before = state.irregular
        let v = try state.parseValue(depth: 1)
        return (v, start ..< state.pos, state.irregular == before)
    }

    /// Whether the value of the member whose name was just read is exactly
    /// `literal`'s bytes (a JSON string with its quotes, say): compared,
    /// then skipped. On a mismatch the reader does not move.
    public mutating func skip(ifExactly literal: StaticString) -> Bool {
        let n = literal.utf8CodeUnitCount
        let buf = state.buf
        guard state.pos &+ n <= buf.count, memcmp(buf.baseAddress! + state.pos, literal.utf8Start, n) == 0 else { return false }
        state.pos &+= n
        return true
    }
}

extension JSONParser {
    /// Runs `body` with a reader over `buf`, which must hold one JSON object
    /// (``JSONMemberReader``), and returns what `body` returns; false when
    /// `buf` does not start with `{`.
    public func readMembers(_ buf: UnsafeBufferPointer<UInt8>, _ body: (inout JSONMemberReader) -> Bool) -> Bool {
        guard buf.count >= 2, buf[0] == UInt8(ascii: "{") else { return false }
        let scratch = ParseScratch.current
        var reader = JSONMemberReader(state: ParserState(buf: buf, maxDepth: maxDepth, scratch: scratch))
        reader.state.pos = 1
        defer { reader.state.giveBack(to: scratch) }
        return body(&reader)
    }
}
