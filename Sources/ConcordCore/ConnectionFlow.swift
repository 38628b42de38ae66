public import Synchronization

/// Counters that one connection's driver (the event loop) and the core share,
/// so each side sees how far the other is behind without sending a message.
///
/// The core adds to `unsent` when it hands output over; the driver subtracts
/// what the socket took. The driver adds to `unprocessed` when it reads lines;
/// whoever hands them to the engine subtracts. `coalescing` is written by the
/// core only: 0, or the number of the coalescing episode in progress
/// (PROTOCOL.md §6.6), which the driver echoes back in `outputDrained`.
public final class ConnectionFlow: Sendable {
    public let unsent = Atomic<Int>(0)
    public let unprocessed = Atomic<Int>(0)
    public let coalescing = Atomic<Int>(0)

    public init() {}
}

/// The process at the other end of a Unix socket (SO_PEERCRED).
public struct PeerCredentials: Sendable {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32
    public init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }
}
