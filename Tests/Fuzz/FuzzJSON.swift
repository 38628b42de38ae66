// libFuzzer target: the JSON parser. Whatever it accepts must encode and
// parse back to an equal value, and encoding must be stable (encode(parse(
// encode(v))) == encode(v)). Invalid input must be rejected, never crash.
import ConcordJSON

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let parser = JSONParser(maxDepth: 128)
    guard let value = try? parser.parse(bytes) else { return 0 }
    let once = value.encoded()
    guard let again = try? parser.parse(once) else { fatalError("encoded output does not parse: \(String(decoding: once, as: UTF8.self))") }
    if again != value { fatalError("round trip changed the value: \(String(decoding: once, as: UTF8.self))") }
    if again.encoded() != once { fatalError("encoding is not stable: \(String(decoding: once, as: UTF8.self))") }
    return 0
}
