import Foundation

/// Resuming after a reconnect (PROTOCOL §3.2): a client holding `keys` key
/// subscriptions goes away, `changed` of the documents change, and it comes
/// back — resubscribing every view with `since` (unchanged views answer one
/// short line) or without (every value sent again). Bytes the client reads
/// and the time until the last answer, for both.
struct ResumeResult {
    var bytesWithSince = 0
    var bytesWithout = 0
    var secondsWithSince = 0.0
    var secondsWithout = 0.0
}

func resumeScenario(socket: String, keys: Int, changed: Int) throws -> ResumeResult {
    let w = try Conn(socket)
    let body = String(repeating: "x", count: 120)
    var buf = ""
    for k in 0..<keys {
        buf += #"{"op":"update","key":"doc\#(k)","model":{"title":"Document \#(k)","body":"\#(body)","by":{"id":"Person:\#(k % 100)","name":"P"}}}"# + "\n"
    }
    w.write(buf)
    w.skipLines(keys)
    // The first session: every key subscribed; the seq it saw.
    let first = try Conn(socket)
    var subs = ""
    for k in 0..<keys { subs += #"{"op":"subscribe","sub":"k\#(k)","key":"doc\#(k)"}"# + "\n" }
    first.write(subs)
    first.skipLines(keys - 1)
    let last = String(decoding: first.readLine() ?? [], as: UTF8.self)
    let seen = Int(last.split(separator: "\"seq\":").last?.prefix { $0.isNumber } ?? "0") ?? 0
    first.hangUp()
    // Away: 1 % of the documents change.
    var edits = ""
    for k in stride(from: 0, to: keys, by: max(1, keys / changed)) {
        edits += #"{"op":"update","key":"doc\#(k)","model":{"title":"Edited \#(k)","body":"\#(body)"}}"# + "\n"
    }
    w.write(edits)
    w.skipLines(edits.split(separator: "\n").count)
    func resume(since: Int?) throws -> (Int, Double) {
        let c = try Conn(socket)
        var lines = ""
        for k in 0..<keys {
            lines += #"{"op":"subscribe","sub":"k\#(k)","key":"doc\#(k)"\#(since.map { ",\"since\":\($0)" } ?? "")}"# + "\n"
        }
        let start = nowNanos()
        c.write(lines)
        var bytes = 0
        var n = 0
        while n < keys, let line = c.readLine() {
            bytes += line.count + 1
            n += 1
        }
        let t = seconds(since: start)
        c.hangUp()
        return (bytes, t)
    }
    var r = ResumeResult()
    (r.bytesWithSince, r.secondsWithSince) = try resume(since: seen)
    (r.bytesWithout, r.secondsWithout) = try resume(since: nil)
    return r
}
