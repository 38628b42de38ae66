/// An error from the server (its wire code and message) or from the connection.
///
/// `code` is the protocol's error code (`bad_request`, `no_such_sub`, …) for
/// answers from the server, or one of the client's own codes:
/// ``Code/disconnected``, ``Code/closed``, ``Code/badResponse``,
/// ``Code/encoding``. The description never includes model contents.
public struct ConcordError: Error, Sendable, CustomStringConvertible, Equatable {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(_ rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        // Wire codes (PROTOCOL.md §7).
        public static let parseError = Code("parse_error")
        public static let badRequest = Code("bad_request")
        public static let unknownOp = Code("unknown_op")
        public static let tooLarge = Code("too_large")
        public static let tooDeep = Code("too_deep")
        public static let subExists = Code("sub_exists")
        public static let noSuchSub = Code("no_such_sub")
        public static let badIndex = Code("bad_index")
        public static let notEntity = Code("not_entity")
        public static let limitExceeded = Code("limit_exceeded")
        public static let cacheError = Code("cache_error")
        public static let shuttingDown = Code("shutting_down")
        public static let `internal` = Code("internal")

        // Client-side codes.
        /// The connection dropped before the answer came (the client reconnects on its own).
        public static let disconnected = Code("disconnected")
        /// The client was closed.
        public static let closed = Code("closed")
        /// The server's answer could not be understood.
        public static let badResponse = Code("bad_response")
        /// A model could not be encoded or decoded.
        public static let encoding = Code("encoding")
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }
}
