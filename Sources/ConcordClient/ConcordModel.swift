public import ConcordJSON
import Foundation

/// A Codable model with an identity, as RocketData's `Model`.
///
/// Declare the identity as a ``ConcordID`` of the model's own type; on the
/// wire it becomes `Type:raw` (`Person:12`), so identities are global across
/// types, and nested models are prefixed with their own type:
///
/// ```swift
/// struct Person: ConcordModel {
///     var id: ConcordID<Person>      // "12" here, "Person:12" on the wire
///     var name: String
/// }
/// struct Message: ConcordModel {
///     var id: ConcordID<Message>
///     var text: String
///     var sender: Person             // swapped everywhere when Person:12 changes
/// }
/// ```
///
/// A model whose identities are already global sets ``usesGlobalIdentity``.
public protocol ConcordModel: Codable, Sendable {
    /// The type prefix. Default: the Swift type's name.
    static var typeName: String { get }
    /// True when `id` already holds a global identity (no prefix). Default false.
    static var usesGlobalIdentity: Bool { get }
    var id: ConcordID<Self> { get }
}

extension ConcordModel {
    /// The Swift type's name: `Person` for `struct Person`.
    public static var typeName: String { String(describing: Self.self) }
    /// False: ids are prefixed with ``typeName``.
    public static var usesGlobalIdentity: Bool { false }

    /// The identity on the wire.
    public var globalIdentity: String { id.global }
}

/// An identity of a `Model`: stores the raw id, encodes the global one.
public struct ConcordID<Model: ConcordModel>: Codable, Hashable, Sendable, CustomStringConvertible,
    ExpressibleByStringLiteral, ExpressibleByIntegerLiteral
{
    /// The id within its type ("12").
    public var raw: String

    /// An id within the model's type (`"12"`, not `"Person:12"`).
    public init(_ raw: String) { self.raw = raw }
    /// `let id: ConcordID<Person> = "12"`.
    public init(stringLiteral value: String) { raw = value }
    /// `let id: ConcordID<Person> = 12`.
    public init(integerLiteral value: Int) { raw = String(value) }

    /// The identity on the wire ("Person:12").
    public var global: String { Model.usesGlobalIdentity ? raw : "\(Model.typeName):\(raw)" }
    /// The global identity.
    public var description: String { global }

    /// Decodes a global identity (or a bare id, a string or an integer).
    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        let s: String
        if let str = try? c.decode(String.self) { s = str } else { s = String(try c.decode(Int.self)) }
        let prefix = "\(Model.typeName):"
        raw = !Model.usesGlobalIdentity && s.hasPrefix(prefix) ? String(s.dropFirst(prefix.count)) : s
    }

    /// Encodes the global identity, as the server expects it.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(global)
    }
}

/// Codable ↔ JSON for models. Not the server's hot path: Foundation's coders are fine here.
public enum ModelCoding {
    /// A model as JSON (Foundation's encoder); throws ``ConcordError`` with code `encoding`.
    public static func json<M: Encodable>(_ model: M) throws -> JSON {
        do {
            let data = try JSONEncoder().encode(model)
            // A model the app encodes; the server refuses what nests deeper than its --max-depth.
            return try JSONParser(maxDepth: ConcordClient.maxMessageDepth).parse(Array(data))
        } catch {
            throw ConcordError(.encoding, "cannot encode \(M.self): \(error)")
        }
    }

    /// A model from the server's JSON; throws ``ConcordError`` with code `encoding` when it does not decode.
    public static func model<M: Decodable>(_ type: M.Type, from json: JSON) throws -> M {
        do {
            return try JSONDecoder().decode(M.self, from: Data(json.encoded()))
        } catch {
            throw ConcordError(.encoding, "cannot decode \(M.self) from the server's value: \(error)")
        }
    }
}
