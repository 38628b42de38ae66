/// A wire error code (PROTOCOL.md §7). A struct over a string rather than an
/// enum so new codes never break exhaustive switches in callers.
public struct ErrorCode: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let parseError = ErrorCode("parse_error")
    public static let badRequest = ErrorCode("bad_request")
    public static let unknownOp = ErrorCode("unknown_op")
    public static let tooLarge = ErrorCode("too_large")
    public static let tooDeep = ErrorCode("too_deep")
    public static let subExists = ErrorCode("sub_exists")
    public static let noSuchSub = ErrorCode("no_such_sub")
    public static let badIndex = ErrorCode("bad_index")
    public static let notEntity = ErrorCode("not_entity")
    public static let limitExceeded = ErrorCode("limit_exceeded")
    public static let cacheError = ErrorCode("cache_error")
    public static let shuttingDown = ErrorCode("shutting_down")
    public static let `internal` = ErrorCode("internal")

    /// Not in PROTOCOL.md §7: sent (without a `rid`, before the connection is
    /// closed) to a peer whose uid and gid are outside `--allow-uid` /
    /// `--allow-gid` (docs/PROTOCOL.md, "Connections").
    public static let forbidden = ErrorCode("forbidden")

    /// Every code the server sends, §7 order, then `forbidden`.
    public static let all: [ErrorCode] = [
        .parseError, .badRequest, .unknownOp, .tooLarge, .tooDeep, .subExists, .noSuchSub, .badIndex,
        .notEntity, .limitExceeded, .cacheError, .shuttingDown, .internal, .forbidden,
    ]
}

/// An error answered to a request: a code and a message saying what and where.
public struct ProtocolError: Error, Sendable, CustomStringConvertible {
    public var code: ErrorCode
    public var message: String

    public init(_ code: ErrorCode, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }

    /// The same error with `prefix` put before its message (`ops[3]: ...`).
    public func prefixed(_ prefix: String) -> ProtocolError {
        ProtocolError(code, "\(prefix): \(message)")
    }
}
