public import ConcordJSON

/// SplitMix64: small, seedable, good enough for test sequences.
public struct SeededRandom: RandomNumberGenerator {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// A change that does not fit the list it is applied to.
public struct ChangeError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

/// Applies a `collection` event's changes to a copy, as every subscriber does
/// (PROTOCOL.md §4 collections); throws when a change does not fit.
public func applyChanges(_ list: inout [JSON], _ event: JSON) throws {
    for c in event["changes"]?.arrayValue ?? [] {
        let index = c["index"]?.numberValue?.intValue ?? -1
        switch c["op"]?.stringValue {
        case "insert":
            guard index >= 0 && index <= list.count else { throw ChangeError("insert at \(index) outside 0...\(list.count)") }
            list.insert(contentsOf: c["items"]?.arrayValue ?? [], at: index)
        case "remove":
            let n = c["count"]?.numberValue?.intValue ?? 0
            guard index >= 0 && n >= 1 && index + n <= list.count else { throw ChangeError("remove \(n) at \(index) from \(list.count)") }
            list.removeSubrange(index..<(index + n))
        case "update":
            guard index >= 0 && index < list.count else { throw ChangeError("update at \(index) outside \(list.count)") }
            list[index] = c["item"] ?? .null
        case "reset":
            list = c["items"]?.arrayValue ?? []
        default:
            throw ChangeError("unknown change \(c.compactString)")
        }
    }
}
