import Synchronization
import ConcordJSON
import Testing

@testable import ConcordCore

/// A stored value that is the request's own `model` is written into events
/// from the request's bytes (`Engine.writeStored`): every byte the clients
/// get must be what encoding the value gives.
struct VerbatimModelTests {
    /// Runs the same mutations, written compactly (spliced) or with a space
    /// inside each model (not verbatim: encoded), and returns every byte each
    /// connection received, and how many values were spliced.
    /// An engine with the internal checks on.
    static func checkedEngine() -> Engine {
        var cfg = EngineConfiguration()
        cfg.internalChecks = true
        return Engine(configuration: cfg)
    }

    /// Appends what the engine handed each connection to `bytes`.
    static func take(_ e: Engine, into bytes: inout [Int: [UInt8]]) {
        for (id, chunks) in e.takeOutput() {
            for ch in chunks { bytes[id, default: []].append(contentsOf: UnsafeRawBufferPointer(start: ch.base, count: ch.count)) }
        }
    }

    func run(padded: Bool) -> (bytes: [Int: [UInt8]], spliced: Int) {
        let e = Self.checkedEngine()
        var bytes: [Int: [UInt8]] = [:]
        func pump() { Self.take(e, into: &bytes) }
        for c in 1...3 { e.open(c) }
        let model = #""model":"#
        func send(_ line: String, _ c: Int) {
            let line = padded ? line.replacing(#""model":{"#, with: #""model":{ "#) : line
            e.handleLine(Array(line.utf8), from: c)
            pump()
        }
        send(#"{"op":"update","key":"doc","#  + model + #"{"id":"A:1","n":0,"b":{"id":"B:1","s":"x"}}}"#, 1)
        send(#"{"op":"subscribe","sub":"k","key":"doc"}"#, 2)
        send(#"{"op":"subscribe","sub":"i","ids":["A:1","B:1"]}"#, 2)
        send(#"{"op":"subscribe","sub":"m","model":{"id":"A:1","b":{"id":"B:1"}}}"#, 3)
        send(#"{"op":"subscribe","sub":"f","feed":{}}"#, 3)
        // The written entity below the root: a model view and a document
        // holding it (spliced at depth).
        send(#"{"op":"subscribe","sub":"w","model":{"wrap":[{"id":"A:1","b":{"id":"B:1"}},{"no":"id"}],"x":1}}"#, 3)
        send(#"{"op":"update","key":"doc2","# + model + #"{"list":[{"id":"B:1"},2],"y":{"z":{"id":"A:1"}}}}"#, 1)
        send(#"{"op":"subscribe","sub":"k2","key":"doc2"}"#, 2)
        for i in 1...20 {
            switch i % 4 {
            case 0: send(#"{"op":"update","key":"doc","# + model + #"{"id":"A:1","n":\#(i),"b":{"id":"B:1","s":"x\#(i)"}}}"#, 1)
            case 1: send(#"{"op":"update","# + model + #"{"id":"B:1","s":"é \#(i)","t":[1,{"u":null}]}}"#, 1)
            case 2: send(#"{"op":"update","# + model + #"{"id":"A:1","n":\#(i),"b":{"id":"B:1"}}}"#, 1)
            default: send(#"{"op":"update","mode":"merge","# + model + #"{"id":"A:1","m":\#(i)}}"#, 1)
            }
        }
        return (bytes, e.splicedValues.load(ordering: .relaxed))
    }

    @Test func splicedEventsAreTheBytesEncodingGives() {
        let spliced = run(padded: false)
        let encoded = run(padded: true)
        #expect(encoded.spliced == 0)
        #expect(spliced.spliced > 40)
        for c in 1...3 {
            #expect(spliced.bytes[c] == encoded.bytes[c], "connection \(c)")
        }
        #expect((spliced.bytes[2]?.count ?? 0) > 2000)
    }

    /// A fan-out writes the bytes every subscriber shares once (`Engine.enqueue`):
    /// each subscriber must get exactly the event a lone subscriber gets.
    @Test func aSharedEventIsTheEventALoneSubscriberGets() {
        func run(subscribers: Int) -> [UInt8] {
            let e = Self.checkedEngine()
            var bytes: [UInt8] = []
            func send(_ line: String, _ c: Int) {
                e.handleLine(Array(line.utf8), from: c)
                for (id, chunks) in e.takeOutput() where id == 2 {
                    for ch in chunks { bytes.append(contentsOf: UnsafeRawBufferPointer(start: ch.base, count: ch.count)) }
                }
            }
            for c in 1...(subscribers + 1) { e.open(c) }
            for c in 2...(subscribers + 1) {
                send(#"{"op":"subscribe","sub":"k","key":"doc"}"#, c)
                send(#"{"op":"subscribe","sub":"q\"uote","key":"doc"}"#, c)
                send(#"{"op":"subscribe","sub":"big","key":"big"}"#, c)
                send(#"{"op":"subscribe","sub":"posts","query":{"type":"Post","order":[{"path":"n"}]}}"#, c)
            }
            let long = String(repeating: "x", count: 2000)  // past OutputQueue.copyLimit: referenced, not copied
            for i in 1...10 {
                send(#"{"op":"update","key":"doc","model":{"id":"A:1","n":\#(i)}}"#, 1)
                send(#"{"op":"update","key":"big","model":{"id":"B:1","s":"\#(long)","n":\#(i)}}"#, 1)
                send(#"{"op":"update","model":{"id":"Post:\#(i % 3)","n":\#(i)}}"#, 1)
            }
            return bytes
        }
        let alone = run(subscribers: 1)
        #expect(alone.count > 20_000)
        let text = String(decoding: alone, as: UTF8.self)
        #expect(text.contains(#""event":"query","sub":"posts""#))
        #expect(text.contains(#""event":"update","sub":"q\"uote""#))
        #expect(run(subscribers: 3) == alone)
    }

    /// A mutation with one render job writes a short payload into a buffer
    /// the engine reuses (`Engine.smallPayload`), and a fan-out's shared
    /// event into another (`sharedEventBuffer`). Events queued by many such
    /// mutations and read only at the end, payloads on both sides of
    /// `OutputQueue.copyLimit` (copied into the queues below it, referenced
    /// above), must be the bytes read one mutation at a time.
    @Test func reusedPayloadBuffersNeverChangeQueuedEvents() {
        func run(subscribers: Int, readEachTime: Bool) -> [Int: [UInt8]] {
            let e = Self.checkedEngine()
            var bytes: [Int: [UInt8]] = [:]
            func pump() { Self.take(e, into: &bytes) }
            for c in 1...(subscribers + 1) { e.open(c) }
            for c in 2...(subscribers + 1) {
                e.handleLine(Array(#"{"op":"subscribe","sub":"k","key":"doc"}"#.utf8), from: c)
                e.handleLine(Array(#"{"op":"subscribe","sub":"e","ids":["B:1"]}"#.utf8), from: c)
            }
            pump()
            bytes = [:]
            // One render job per mutation (a key view; an entity's
            // watchers). The payload grows by 3 bytes a step, from ~960 to ~1,080 bytes.
            for i in 0..<40 {
                let s = String(repeating: "y", count: 920 + 3 * i)
                e.handleLine(Array(#"{"op":"update","key":"doc","model":{"id":"A:1","s":"\#(s)","n":\#(i)}}"#.utf8), from: 1)
                e.handleLine(Array(#"{"op":"update","model":{"id":"B:1","s":"\#(s)","n":\#(i + 1000)}}"#.utf8), from: 1)
                if readEachTime { pump() }
            }
            pump()
            return bytes
        }
        for n in [1, 3] {
            let once = run(subscribers: n, readEachTime: false)
            let each = run(subscribers: n, readEachTime: true)
            let same = once == each  // (not inside #expect: it would print every byte)
            #expect(same, "\(n) subscriber(s)")
            #expect((once[2]?.count ?? 0) > 80_000)
            let text = String(decoding: once[2] ?? [], as: UTF8.self)
            #expect(text.contains(#""n":39}"#) && text.contains(#""n":1039}"#))
        }
    }
}
