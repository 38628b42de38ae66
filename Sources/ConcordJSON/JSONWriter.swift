/// Compact JSON encoding into a byte array.
///
/// No Foundation, no intermediate strings: values are appended byte by byte
/// with the minimal escaping RFC 8259 requires (quote, backslash, control
/// characters). Numbers are written as their original lexeme.
public struct JSONWriter: Sendable {
    public var bytes: [UInt8]

    public init(capacity: Int = 256) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    /// Continues writing after `bytes` (which the writer takes over).
    public init(adopting bytes: [UInt8]) {
        self.bytes = bytes
    }

    @inlinable public mutating func raw(_ s: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
    }

    @inlinable public mutating func raw(_ other: [UInt8]) {
        bytes.append(contentsOf: other)
    }

    /// `other[range]`, as it is (bytes the caller knows to be this writer's
    /// encoding of a value).
    @inlinable public mutating func raw(_ other: [UInt8], _ range: Range<Int>) {
        other.withUnsafeBufferPointer { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: $0[range])) }
    }

    /// `other`'s bytes at offsets `range` from its start (a slice's indices
    /// are its array's; `range` counts from the slice's first byte).
    @inlinable public mutating func raw(_ other: ArraySlice<UInt8>, _ range: Range<Int>) {
        other.withUnsafeBufferPointer { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: $0[range])) }
    }

    public mutating func string(_ s: String) {
        // Contiguous UTF-8 without copying the string (small strings are
        // spilled to the stack by the standard library).
        if let done = s.utf8.withContiguousStorageIfAvailable({ utf8 -> Bool in
            appendQuoted(utf8)
            return true
        }), done {
            return
        }
        var s = s
        s.withUTF8 { appendQuoted($0) }
    }

    /// `utf8` between quotes, escaped as RFC 8259 requires. Runs that need no
    /// escaping (almost everything) are copied in one piece.
    @inline(__always)
    private mutating func appendQuoted(_ utf8: UnsafeBufferPointer<UInt8>) {
        // Grown geometrically: `reserveCapacity` allocates exactly what it is
        // asked for, so reserving before every string would copy the whole
        // buffer once per string that does not fit.
        let needed = bytes.count + utf8.count + 2
        if needed > bytes.capacity { bytes.reserveCapacity(Swift.max(needed, bytes.capacity &* 2)) }
        bytes.append(0x22)
        do {
            guard let base = utf8.baseAddress else { bytes.append(0x22); return }
            let end = utf8.count
            var runStart = 0
            while true {
                let i = ByteScan.skipUnescaped(base, from: runStart, end: end)
                if runStart < i { bytes.append(contentsOf: UnsafeBufferPointer(start: base + runStart, count: i &- runStart)) }
                if i == end { break }
                let c = base[i]
                runStart = i &+ 1
                switch c {
                case 0x22: bytes.append(0x5C); bytes.append(0x22)
                case 0x5C: bytes.append(0x5C); bytes.append(0x5C)
                case 0x0A: bytes.append(0x5C); bytes.append(UInt8(ascii: "n"))
                case 0x0D: bytes.append(0x5C); bytes.append(UInt8(ascii: "r"))
                case 0x09: bytes.append(0x5C); bytes.append(UInt8(ascii: "t"))
                case 0x08: bytes.append(0x5C); bytes.append(UInt8(ascii: "b"))
                case 0x0C: bytes.append(0x5C); bytes.append(UInt8(ascii: "f"))
                default:
                    let hex: [UInt8] = Array("0123456789abcdef".utf8)
                    bytes.append(contentsOf: [0x5C, UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"), hex[Int(c >> 4)], hex[Int(c & 0xF)]])
                }
            }
        }
        bytes.append(0x22)
    }

    public mutating func int(_ v: Int) {
        if v >= 0 && v < 10 {
            bytes.append(UInt8(ascii: "0") + UInt8(v))
            return
        }
        var v = v
        if v < 0 {
            bytes.append(UInt8(ascii: "-"))
            if v == Int.min {
                bytes.append(contentsOf: Array("9223372036854775808".utf8))
                return
            }
            v = -v
        }
        var tmp: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                  UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var n = 0
        withUnsafeMutableBytes(of: &tmp) { t in
            while v > 0 {
                t[n] = UInt8(ascii: "0") + UInt8(v % 10)
                v /= 10
                n += 1
            }
            for i in stride(from: n - 1, through: 0, by: -1) { bytes.append(t[i]) }
        }
    }

    public mutating func value(_ v: JSON) {
        switch v {
        case .null: raw("null")
        case .bool(let b): if b { raw("true") } else { raw("false") }
        case .number(let n):
            if n.text.utf8.withContiguousStorageIfAvailable({ bytes.append(contentsOf: $0) }) == nil {
                var t = n.text
                t.withUTF8 { bytes.append(contentsOf: $0) }
            }
        case .string(let s): string(s)
        case .array(let a):
            bytes.append(UInt8(ascii: "["))
            // By index: no element or member copied out (a retain and a
            // release each).
            for i in a.indices {
                if i > 0 { bytes.append(UInt8(ascii: ",")) }
                value(a[i])
            }
            bytes.append(UInt8(ascii: "]"))
        case .object(let o):
            bytes.append(UInt8(ascii: "{"))
            let members = o.members
            for i in members.indices {
                if i > 0 { bytes.append(UInt8(ascii: ",")) }
                string(members[i].key)
                bytes.append(UInt8(ascii: ":"))
                value(members[i].value)
            }
            bytes.append(UInt8(ascii: "}"))
        }
    }

    /// Writes `"key":` (with the leading comma the caller asks for).
    public mutating func key(_ k: StaticString, comma: Bool = true) {
        if comma { bytes.append(UInt8(ascii: ",")) }
        bytes.append(0x22)
        raw(k)
        bytes.append(0x22)
        bytes.append(UInt8(ascii: ":"))
    }
}

extension JSON {
    /// The compact encoding of this value.
    public func encoded() -> [UInt8] {
        var w = JSONWriter()
        w.value(self)
        return w.bytes
    }

    /// The compact encoding as a string (for tests and logs).
    public var compactString: String { String(decoding: encoded(), as: UTF8.self) }
}
