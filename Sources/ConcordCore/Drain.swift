extension Array {
    /// Empties the array, keeping its capacity, with each element destroyed
    /// by this module's code for its type: `removeAll(keepingCapacity:)`
    /// destroys them through the runtime's generic witnesses, measured at
    /// ~500 instructions for a mutation's one-element list of effects.
    @inlinable @inline(__always)
    public mutating func drain() {
        while popLast() != nil {}
    }

    /// `drain()` while the storage has room for at most `limit` elements;
    /// past that the storage is let go (a burst does not pin memory).
    @inlinable @inline(__always)
    public mutating func drain(keepingAtMost limit: Int) {
        if capacity <= limit { drain() } else { self = [] }
    }
}

extension UnsafeMutablePointer {
    /// `deinitialize(count:)` one element at a time in this module's code
    /// for the type (the runtime's generic loop costs more per element).
    @inline(__always)
    func destroy(count: Int) {
        for i in 0..<count { _ = (self + i).move() }
    }
}
