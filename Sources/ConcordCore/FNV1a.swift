/// FNV-1a, 64 bits: the one hash of bytes the cluster's checks use (state
/// digests, outcome digests, snapshot checksums). Unlike `Hasher`, it does
/// not depend on the process's seed, so two hosts agree on it.
public struct FNV1a: Sendable {
    public private(set) var value: UInt64 = 0xcbf2_9ce4_8422_2325

    public init() {}

    @inline(__always)
    public mutating func add(_ byte: UInt8) { value = (value ^ UInt64(byte)) &* 0x100_0000_01b3 }

    public mutating func add(_ bytes: some Sequence<UInt8>) { for b in bytes { add(b) } }

    public static func hash(_ bytes: some Sequence<UInt8>) -> UInt64 {
        var h = FNV1a()
        h.add(bytes)
        return h.value
    }
}
