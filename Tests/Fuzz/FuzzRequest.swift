// libFuzzer target: request decoding. Any JSON object decodes to a request
// or a ProtocolError with a code and a message; nothing crashes. A line
// `UpdateLine.read` takes (an update read from its bytes) decodes to the
// same request through the full parse, with its model at the same bytes.
import ConcordJSON
import ConcordProtocol

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let parser = JSONParser(maxDepth: 128)
    let fast = bytes.withUnsafeBufferPointer { UpdateLine.read($0, parser: parser) }
    guard let (value, range) = try? parser.parse(bytes, verbatimMember: "model") else {
        if fast != nil { fatalError("UpdateLine read a line the parser refuses") }
        return 0
    }
    do {
        let request = try Request.decode(value, idKey: "id")
        if let fast {
            if fast.request.decodedText != request.decodedText { fatalError("UpdateLine read another request") }
            if fast.modelRange != range { fatalError("UpdateLine's model range differs from the parser's") }
        }
    } catch {
        if error.message.isEmpty { fatalError("an error without a message: \(error.code)") }
        if fast != nil { fatalError("UpdateLine read a line the decoder refuses: \(error.code)") }
    }
    return 0
}
