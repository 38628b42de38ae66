@_exported public import struct ConcordProtocol.ErrorCode

/// An error from the server (its wire code and message) or from the connection.
///
/// `code` is the protocol's error code (`bad_request`, `no_such_sub`, …) for
/// answers from the server, or one of the client's own codes:
/// `.disconnected`, `.closed`, `.badResponse`,
/// `.encoding`. The description never includes model contents.
public struct ConcordError: Error, Sendable, CustomStringConvertible, Equatable {
    /// The wire codes are ConcordProtocol's `ErrorCode` (one definition for
    /// the server and the SDK); the client's own codes are added below.
    public typealias Code = ErrorCode

    /// The server's error code (PROTOCOL.md §7), or a client-side one (`closed`, `encoding`, …).
    public var code: Code
    /// A sentence for people; match on ``code``, not on this.
    public var message: String
    /// For `conflict` (a conditional write found what it writes changed, PROTOCOL §4.1): what changed.
    public var conflict: Conflict?
    /// For `unavailable` from a cluster host (PROTOCOL §8): the host cannot
    /// know whether the mutation reached the log. It may still be applied,
    /// once, on every host — retry it with the same `token` to learn its
    /// outcome (a duplicate answers with the original's seq). When false,
    /// nothing was applied. (A `.disconnected` mutation's outcome is not
    /// known either: the same retry tells it.)
    public var indeterminate = false

    /// What a conditional write found changed since the seq it was based on.
    public struct Conflict: Sendable, Equatable {
        /// The latest seq among the changes: read again, then retry with it.
        public var seq: Int
        /// The names that changed (at most 100 in all).
        public var entities: [String]
        public var keys: [String]
        public var collections: [String]

        /// A conflict as the server reports it.
        public init(seq: Int, entities: [String], keys: [String], collections: [String]) {
            self.seq = seq
            self.entities = entities
            self.keys = keys
            self.collections = collections
        }
    }

    /// An error with this code and message.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// `code: message`.
    public var description: String { "\(code): \(message)" }
}

/// The client's own codes, never sent by a server.
extension ErrorCode {
    /// The connection dropped before the answer came (the client reconnects on its own).
    public static let disconnected = ErrorCode("disconnected")
    /// The client was closed.
    public static let closed = ErrorCode("closed")
    /// The server's answer could not be understood.
    public static let badResponse = ErrorCode("bad_response")
    /// A model could not be encoded or decoded.
    public static let encoding = ErrorCode("encoding")
}
