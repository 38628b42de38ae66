// libFuzzer target: request decoding. Any JSON object decodes to a request
// or a ProtocolError with a code and a message; nothing crashes.
import ConcordJSON
import ConcordProtocol

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    guard let value = try? JSONParser(maxDepth: 128).parse(bytes) else { return 0 }
    do {
        _ = try Request.decode(value, idKey: "id")
    } catch {
        if error.message.isEmpty { fatalError("an error without a message: \(error.code)") }
    }
    return 0
}
