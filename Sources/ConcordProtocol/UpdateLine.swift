#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
public import ConcordJSON

/// An `update` request read straight from its line's bytes, without the
/// request object's tree: its members found by comparing their names'
/// bytes, only their values parsed.
///
/// ``read(_:parser:)`` takes only the regular form (``JSONMemberReader``)
/// of an object whose members are all ones an update reads — `op`
/// (exactly `"update"`), `rid` (a scalar), `model`, `key`, `mode`, `force`,
/// `token`, `context`, `origin`, `if_unchanged_since` — each at most once,
/// and checks them with the decoder's own functions (`Request.update`,
/// `Request.options`). Any other line — another op, a member the decoder
/// would ignore, a repeated name, whitespace, a value the decoder refuses,
/// a parse error — gives nil, and the caller parses and decodes it as
/// every other request: this path never answers an error, so the two
/// cannot differ in what they refuse, and for every line it reads
/// `Request.decode` of the full parse gives the same request (asserted by
/// the tests and the request fuzz target).
public struct UpdateLine: Sendable {
    /// `.null` when absent (as ``Request/rid``).
    public let rid: JSON
    /// An `.update`.
    public let mutation: Mutation
    /// The options, when the line gave any (boxed: most lines have none,
    /// and a parsed line is passed around by value).
    @usableFromInline let boxed: Options?
    /// Where the model's bytes lie in the line, when they are exactly what
    /// ``JSONWriter`` writes for it.
    public let modelRange: Range<Int>?

    @usableFromInline final class Options: Sendable {
        @usableFromInline let options: MutationOptions
        init(_ options: MutationOptions) { self.options = options }
    }

    /// Whether the line gave any option (else ``options`` is `MutationOptions()`).
    @inlinable public var hasOptions: Bool { boxed != nil }

    /// Inlinable, as the request below: the engine reads them per update.
    @inlinable public var options: MutationOptions {
        guard let boxed else { return MutationOptions() }
        return boxed.options
    }

    /// The model (an object).
    public var model: JSON {
        if case .update(let model, _, _, _) = mutation { return model }
        return .null
    }

    /// The decoded request.
    @inlinable public var request: Request { Request(rid: rid, op: .mutation(mutation, options)) }

    /// The request object, for a caller that needs the tree (the cluster
    /// log's append): the mutation's ``Mutation/requestObject()``, its
    /// options and `rid` (unless null) — the same request once decoded.
    public var json: JSON {
        var o = mutation.requestObject()
        options.encode(into: &o)
        if !rid.isNull { o["rid"] = rid }
        return .object(o)
    }

    /// The line's update, or nil when the line must be parsed as usual (above).
    public static func read(_ line: UnsafeBufferPointer<UInt8>, parser: JSONParser) -> UpdateLine? {
        var rid = JSON.null, range: Range<Int>?
        var model: JSON?, key: JSON?, mode: JSON?, force: JSON?
        var token: JSON?, context: JSON?, origin: JSON?, ifUnchangedSince: JSON?
        var seen: UInt16 = 0
        let complete = parser.readMembers(line) { r in
            while let name = r.nextName() {
                let bit: UInt16
                if same(name, "op") {
                    guard r.skip(ifExactly: "\"update\"") else { return false }
                    bit = 1
                } else {
                    guard let v = try? r.value() else { return false }
                    switch name.count {
                    case 3 where same(name, "rid"):
                        guard v.value.isScalar else { return false }
                        rid = v.value; bit = 2
                    case 3 where same(name, "key"): key = v.value; bit = 4
                    case 5 where same(name, "model"):
                        model = v.value; bit = 8
                        range = v.regular ? v.range : nil
                    case 4 where same(name, "mode"): mode = v.value; bit = 16
                    case 5 where same(name, "force"): force = v.value; bit = 32
                    case 5 where same(name, "token"): token = v.value; bit = 64
                    case 7 where same(name, "context"): context = v.value; bit = 128
                    case 6 where same(name, "origin"): origin = v.value; bit = 256
                    case 18 where same(name, "if_unchanged_since"): ifUnchangedSince = v.value; bit = 512
                    default: return false
                    }
                }
                guard seen & bit == 0 else { return false }
                seen |= bit
            }
            return r.finished
        }
        guard complete, seen & 1 != 0, let mutation = try? Request.update(model: model, key: key, mode: mode, force: force) else { return nil }
        // Most updates carry no option: then `Request.options` would only say so.
        guard seen & (64 | 128 | 256 | 512) != 0 else { return UpdateLine(rid: rid, mutation: mutation, boxed: nil, modelRange: range) }
        guard let options = try? Request.options(token: token, context: context, origin: origin, ifUnchangedSince: ifUnchangedSince) else { return nil }
        return UpdateLine(rid: rid, mutation: mutation, boxed: Options(options), modelRange: range)
    }

    @inline(__always)
    private static func same(_ name: UnsafeBufferPointer<UInt8>, _ literal: StaticString) -> Bool {
        name.count == literal.utf8CodeUnitCount && memcmp(name.baseAddress!, literal.utf8Start, name.count) == 0
    }
}
