// libFuzzer target: the JSON parser. Whatever it accepts must encode and
// parse back to an equal value, and encoding must be stable (encode(parse(
// encode(v))) == encode(v)). Invalid input must be rejected, never crash.
// The flat tape (JSONTape) must agree with it on every input, and a
// verbatim range must be exactly the writer's encoding.
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
    // Bytes reported verbatim are exactly the writer's encoding of the
    // member parsed from them (a small nested value taken from the
    // thread's table replays what its parse counted), here with the input
    // as a request's `model` (its nested values at depth 3 and deeper).
    let line = Array(#"{"op":"update","model":"#.utf8) + bytes + Array("}".utf8)
    if let (request, range) = try? parser.parse(line, verbatimMember: "model"), let range,
       Array(line[range]) != (request["model"] ?? .null).encoded() {
        fatalError("a verbatim range is not the writer's encoding: \(String(decoding: line, as: UTF8.self))")
    }
    guard let value = try? parser.parse(bytes) else { return 0 }
    let once = value.encoded()
    guard let again = try? parser.parse(once) else { fatalError("encoded output does not parse: \(String(decoding: once, as: UTF8.self))") }
    if again != value { fatalError("round trip changed the value: \(String(decoding: once, as: UTF8.self))") }
    if again.encoded() != once { fatalError("encoding is not stable: \(String(decoding: once, as: UTF8.self))") }
    return 0
}
