import Foundation

/// What a scenario needs from a system under test: Concord or Redis, same shape.
protocol System: Sendable {
    var name: String { get }
    var socket: String { get }
    /// Makes `channels` distinct things to watch exist (Concord: documents holding entities).
    func prepare(channels: Int, offset: Int) throws
    /// The bytes that subscribe connection `viewer` to channels `range`.
    /// `model`: Concord model views instead of keys; `distinct`: each
    /// connection's trees its own (they hold the entity under a member
    /// naming the connection), so no two connections share a view.
    func subscribe(_ range: Range<Int>, model: Bool, distinct: Bool, viewer: Int) -> (bytes: [UInt8], replies: Int)
    /// The bytes that publish/update channel `i` with a ~200-byte JSON payload
    /// stamped `t`; `unique` makes every update a real change (Concord sends
    /// nothing for an update that changes nothing; Redis would still deliver it).
    func publish(_ i: Int, stamp: UInt64, unique: Int) -> [UInt8]
    /// Pattern that marks one delivered event in a subscriber's stream.
    var eventMarker: String { get }
    /// Allocator-side bytes in use (Concord: jemalloc allocated; Redis: used_memory).
    func memoryInUse(_ c: Conn) -> Int
    /// Reads one reply to a subscribe batch (lines or RESP frames).
    func readReplies(_ c: Conn, _ n: Int)
}

extension System {
    /// Key subscriptions, or model views with the same trees on every connection.
    func subscribe(_ range: Range<Int>, model: Bool) -> (bytes: [UInt8], replies: Int) {
        subscribe(range, model: model, distinct: false, viewer: 0)
    }
}

func payload(_ id: String, _ stamp: UInt64, _ unique: Int = 0) -> String {
    #"{"id":"\#(id)","t":\#(stamp),"name":"Ada Lovelace","title":"Analyst","bio":"First to publish an algorithm intended for a machine; notes on the Analytical Engine.","tags":["math","poetry"],"v":\#(unique)}"#
}

struct ConcordSystem: System {
    let name = "concord"
    let socket: String

    func prepare(channels: Int, offset: Int) throws {
        let c = try Conn(socket)
        var buf: [UInt8] = []
        var pending = 0
        for i in offset..<(offset + channels) {
            buf += Array((#"{"op":"update","key":"k\#(i)","model":\#(payload("E:\(i)", 0))}"# + "\n").utf8)
            pending += 1
            if pending == 512 {
                c.write(buf)
                c.skipLines(pending)
                buf.removeAll(keepingCapacity: true)
                pending = 0
            }
        }
        c.write(buf)
        c.skipLines(pending)
    }

    func subscribe(_ range: Range<Int>, model: Bool, distinct: Bool, viewer: Int) -> (bytes: [UInt8], replies: Int) {
        var buf: [UInt8] = []
        for i in range {
            let line = model
                ? (distinct ? #"{"op":"subscribe","sub":"m\#(i)","model":{"viewer":\#(viewer),"item":\#(payload("E:\(i)", 0))}}"#
                            : #"{"op":"subscribe","sub":"m\#(i)","model":\#(payload("E:\(i)", 0))}"#)
                : #"{"op":"subscribe","sub":"k\#(i)","key":"k\#(i)"}"#
            buf += Array((line + "\n").utf8)
        }
        return (buf, range.count)
    }

    func publish(_ i: Int, stamp: UInt64, unique: Int) -> [UInt8] {
        Array((#"{"op":"update","model":\#(payload("E:\(i)", stamp, unique))}"# + "\n").utf8)
    }

    var eventMarker: String { #""event":"# }

    func memoryInUse(_ c: Conn) -> Int {
        c.write(#"{"op":"stats"}"# + "\n")
        guard let line = c.readLine() else { return 0 }
        let s = String(decoding: line, as: UTF8.self)
        guard let r = s.range(of: #""allocated":"#) else { return 0 }
        return Int(s[r.upperBound...].prefix { $0.isNumber }) ?? 0
    }

    func readReplies(_ c: Conn, _ n: Int) { c.skipLines(n) }
}

struct RedisSystem: System {
    let name = "redis"
    let socket: String

    func prepare(channels: Int, offset: Int) throws {}

    func subscribe(_ range: Range<Int>, model: Bool, distinct: Bool, viewer: Int) -> (bytes: [UInt8], replies: Int) {
        // One SUBSCRIBE per 1000 channels; each channel is confirmed by a 3-element reply.
        var buf: [UInt8] = []
        var i = range.lowerBound
        while i < range.upperBound {
            let end = min(i + 1000, range.upperBound)
            buf += resp(["SUBSCRIBE"] + (i..<end).map { "ch\($0)" })
            i = end
        }
        return (buf, range.count)
    }

    func publish(_ i: Int, stamp: UInt64, unique: Int) -> [UInt8] {
        resp(["PUBLISH", "ch\(i)", payload("E:\(i)", stamp, unique)])
    }

    var eventMarker: String { "$7\r\nmessage\r\n" }

    func memoryInUse(_ c: Conn) -> Int {
        c.write(resp(["INFO", "memory"]))
        guard let header = c.readLine(), header.first == UInt8(ascii: "$") else { return 0 }
        let len = Int(String(decoding: header.dropFirst().dropLast(), as: UTF8.self)) ?? 0
        // Lines end in "\r\n"; drop the "\r" ("\r\n" is one Character in Swift).
        var read = 0
        var used = 0
        while read < len, let l = c.readLine() {
            read += l.count + 1
            let line = String(decoding: l.filter { $0 != 13 }, as: UTF8.self)
            if line.hasPrefix("used_memory:") { used = Int(line.dropFirst("used_memory:".count)) ?? 0 }
        }
        _ = c.readLine()  // the bulk string's closing CRLF
        return used
    }

    func readReplies(_ c: Conn, _ n: Int) {
        // Each subscribe confirmation is "*3", "$9", "subscribe", "$n", "chX", ":k" = 6 lines.
        c.skipLines(n * 6)
    }
}
