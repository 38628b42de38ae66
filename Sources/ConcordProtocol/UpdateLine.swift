public import ConcordJSON

/// An `update` request read straight from its line's bytes, without the
/// request object's tree: its `rid`, `key` and `model`, found by comparing
/// the member names' bytes; only the values are parsed.
///
/// ``read(_:parser:)`` takes only the line that needs nothing else: the
/// regular form (``JSONMemberReader``), the members `op` (exactly
/// `"update"`), `model` (an object), `key` (a string) and `rid` (a scalar),
/// each at most once. Any other line — another op, another member
/// (`mode`, `force`, `token`, `context`, `origin`, `if_unchanged_since`,
/// or one the decoder ignores), a repeated name, whitespace, a value of
/// the wrong type, a parse error — gives nil, and the caller parses and
/// decodes it as every other request: the two paths cannot answer
/// differently, since this one never answers an error. `Request.decode`
/// of the full parse gives the same request for every line this one reads
/// (asserted by the tests and the request fuzz target).
public struct UpdateLine: Sendable {
    /// `.null` when absent (as ``Request/rid``).
    public var rid: JSON
    public var key: String?
    /// An object.
    public var model: JSON
    /// Where `model`'s bytes lie in the line, when they are exactly what
    /// ``JSONWriter`` writes for it.
    public var modelRange: Range<Int>?

    /// The decoded request: a replacing, unforced update without options.
    public var request: Request {
        Request(rid: rid, op: .mutation(.update(model: model, key: key, mode: .replace, force: false), MutationOptions()))
    }

    /// The request object, for a caller that needs the tree (the cluster
    /// log's append): `op`, `rid` (unless null), `key` (when given), `model`.
    public var json: JSON {
        var o = JSONObject()
        o.members.reserveCapacity(4)
        o.members.append(.init(key: "op", value: .string("update")))
        if !rid.isNull { o.members.append(.init(key: "rid", value: rid)) }
        if let key { o.members.append(.init(key: "key", value: .string(key))) }
        o.members.append(.init(key: "model", value: model))
        return .object(o)
    }

    /// The line's update, or nil when the line must be parsed as usual (above).
    public static func read(_ line: UnsafeBufferPointer<UInt8>, parser: JSONParser) -> UpdateLine? {
        var rid = JSON.null, key: String?, model: JSON?, range: Range<Int>?
        var seen: UInt8 = 0  // op 1, rid 2, key 4, model 8
        let complete = parser.readMembers(line) { r in
            while let name = r.nextName() {
                var bit: UInt8
                switch name.count {
                case 2 where name[0] == UInt8(ascii: "o") && name[1] == UInt8(ascii: "p"):
                    guard r.skip(ifExactly: "\"update\"") else { return false }
                    bit = 1
                case 3 where name[0] == UInt8(ascii: "r") && name[1] == UInt8(ascii: "i") && name[2] == UInt8(ascii: "d"):
                    guard let v = try? r.value(), v.value.isScalar else { return false }
                    rid = v.value
                    bit = 2
                case 3 where name[0] == UInt8(ascii: "k") && name[1] == UInt8(ascii: "e") && name[2] == UInt8(ascii: "y"):
                    guard let v = try? r.value(), case .string(let s) = v.value else { return false }
                    key = s
                    bit = 4
                case 5 where name[0] == UInt8(ascii: "m") && name[1] == UInt8(ascii: "o") && name[2] == UInt8(ascii: "d")
                                && name[3] == UInt8(ascii: "e") && name[4] == UInt8(ascii: "l"):
                    guard let v = try? r.value(), case .object = v.value else { return false }
                    model = v.value
                    range = v.regular ? v.range : nil
                    bit = 8
                default:
                    return false
                }
                guard seen & bit == 0 else { return false }
                seen |= bit
            }
            return r.finished
        }
        guard complete, seen & 9 == 9, let model else { return nil }
        return UpdateLine(rid: rid, key: key, model: model, modelRange: range)
    }
}
