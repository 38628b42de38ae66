// libFuzzer target: the line framer. The first byte chooses how the rest is
// cut into reads; the frames must be the same whatever the read sizes, and
// must match a plain split on "\n".
import ConcordProtocol

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    guard size > 1 else { return 0 }
    let step = Int(data[0]) % 17 + 1
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    let limit = 64
    var whole = LineFramer(maxLineBytes: limit)
    var a: [LineFramer.Frame] = []
    whole.feed(bytes) { a.append($0) }
    var pieces = LineFramer(maxLineBytes: limit)
    var b: [LineFramer.Frame] = []
    var i = 0
    while i < bytes.count {
        let end = min(bytes.count, i + step)
        pieces.feed(Array(bytes[i..<end])) { b.append($0) }
        i = end
    }
    if a != b { fatalError("frames depend on read sizes (step \(step))") }
    // Reference: split complete lines on "\n", drop one trailing "\r", drop blank lines.
    var expected: [LineFramer.Frame] = []
    var line: [UInt8] = []
    for c in bytes {
        if c != 0x0A { line.append(c); continue }
        if line.last == 0x0D { line.removeLast() }
        if line.count > limit {
            expected.append(.tooLarge)
        } else if line.contains(where: { !($0 == 0x20 || $0 == 0x09 || $0 == 0x0D) }) {
            expected.append(.line(line[...]))
        }
        line = []
    }
    // A too-long unfinished line is reported before its newline arrives.
    if line.count > limit + 1 { expected.append(.tooLarge) }
    if a != expected { fatalError("frames differ from the reference split") }
    return 0
}
