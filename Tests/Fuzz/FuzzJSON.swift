// libFuzzer target: the JSON parser. Whatever it accepts must encode and
// parse back to an equal value, and encoding must be stable (encode(parse(
// encode(v))) == encode(v)). Invalid input must be rejected, never crash.
// The flat tape (JSONTape) must agree with it on every input.
import ConcordJSON

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let parser = JSONParser(maxDepth: 128)
    // The flat tape must agree with the tree parser: the same verdict, the
    // same error at the same byte, the same value read back.
    let tree: Result<JSON, JSONParseError> = Result { () throws(JSONParseError) -> JSON in try parser.parse(bytes) }
    var tape = JSONTape(maxDepth: 128)
    bytes.withUnsafeBufferPointer { buf in
        do throws(JSONParseError) {
            try tape.parse(buf)
            guard case .success(let v) = tree else { fatalError("the tape accepts what the parser refuses") }
            if tape.json(0, in: buf).encoded() != v.encoded() { fatalError("the tape reads back another value") }
        } catch {
            guard case .failure(let e) = tree else { fatalError("the tape refuses what the parser accepts: \(error)") }
            if e.kind != error.kind || e.offset != error.offset { fatalError("different errors: \(e) / \(error)") }
        }
    }
    guard let value = try? parser.parse(bytes) else { return 0 }
    let once = value.encoded()
    guard let again = try? parser.parse(once) else { fatalError("encoded output does not parse: \(String(decoding: once, as: UTF8.self))") }
    if again != value { fatalError("round trip changed the value: \(String(decoding: once, as: UTF8.self))") }
    if again.encoded() != once { fatalError("encoding is not stable: \(String(decoding: once, as: UTF8.self))") }
    return 0
}
