public import ConcordJSON

/// A wire error code (PROTOCOL.md §7). A struct over a string rather than an
/// enum so new codes never break exhaustive switches in callers.
public struct ErrorCode: Hashable, Sendable, CustomStringConvertible {
    /// The code as written on the wire.
    public let rawValue: String
    /// A code from its wire spelling (codes are open: a newer server may send one this build does not name).
    public init(_ rawValue: String) { self.rawValue = rawValue }
    /// The wire spelling.
    public var description: String { rawValue }

    /// The line is not JSON.
    public static let parseError = ErrorCode("parse_error")
    /// The JSON is not a valid request: a member missing, of the wrong type, or out of range.
    public static let badRequest = ErrorCode("bad_request")
    /// `op` names no operation.
    public static let unknownOp = ErrorCode("unknown_op")
    /// The line is longer than `--max-line-bytes`; it was skipped.
    public static let tooLarge = ErrorCode("too_large")
    /// The line nests deeper than `--max-depth`.
    public static let tooDeep = ErrorCode("too_deep")
    /// This connection already has a subscription of that name.
    public static let subExists = ErrorCode("sub_exists")
    /// This connection has no subscription of that name.
    public static let noSuchSub = ErrorCode("no_such_sub")
    /// A collection index out of range.
    public static let badIndex = ErrorCode("bad_index")
    /// Something that must be an entity has no valid identity member.
    public static let notEntity = ErrorCode("not_entity")
    /// A configured limit (subscriptions, query views, …) would be passed; nothing was applied.
    public static let limitExceeded = ErrorCode("limit_exceeded")
    /// The cache backend failed; the message says what.
    public static let cacheError = ErrorCode("cache_error")
    /// The server is stopping and takes no new work.
    public static let shuttingDown = ErrorCode("shutting_down")
    /// A bug in the server; the request was not applied.
    public static let `internal` = ErrorCode("internal")

    /// A conditional mutation (`if_unchanged_since`, §4.1) found part of what
    /// it writes changed since; nothing was applied.
    public static let conflict = ErrorCode("conflict")
    /// The server cannot do it now (a `min_seq` or `sync` that timed out, §8).
    public static let unavailable = ErrorCode("unavailable")

    /// Not in PROTOCOL.md §7: sent (without a `rid`, before the connection is
    /// closed) to a peer whose uid and gid are outside `--allow-uid` /
    /// `--allow-gid` (docs/PROTOCOL.md, "Connections").
    public static let forbidden = ErrorCode("forbidden")

    /// Every code the server sends, §7 order, then `forbidden`.
    public static let all: [ErrorCode] = [
        .parseError, .badRequest, .unknownOp, .tooLarge, .tooDeep, .subExists, .noSuchSub, .badIndex,
        .notEntity, .limitExceeded, .cacheError, .shuttingDown, .internal, .conflict, .unavailable, .forbidden,
    ]
}

/// An error answered to a request: a code and a message saying what and where.
public struct ProtocolError: Error, Sendable, CustomStringConvertible {
    /// The code sent as `error.code`.
    public var code: ErrorCode
    /// The sentence sent as `error.message`.
    public var message: String
    /// More members of the `error` object (a conflict's `seq` and `conflicts`).
    public var details: [(String, JSON)] = []

    /// An error to answer a request with.
    public init(_ code: ErrorCode, _ message: String, details: [(String, JSON)] = []) {
        self.code = code
        self.message = message
        self.details = details
    }

    /// `code: message`.
    public var description: String { "\(code): \(message)" }

    /// The same error with `prefix` put before its message (`ops[3]: ...`).
    public func prefixed(_ prefix: String) -> ProtocolError {
        ProtocolError(code, "\(prefix): \(message)", details: details)
    }
}
