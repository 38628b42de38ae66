import ConcordJSON
import Testing

@testable import ConcordCore

/// The output queue against a plain byte array: every kind of append, takes
/// at random points, and chunks read only at the end — after the queue went
/// on writing its blocks — so a byte handed out and then overwritten fails.
struct OutputQueueTests {
    @Test func chunksKeepTheirBytesWhileTheQueueWritesOn() {
        var rng = SplitMix(seed: 19)
        let client = ClientSession(id: 1, flow: ConnectionFlow())
        let subs = ["plain", "with \"quote\"", "", String(repeating: "n", count: 40), "é"].map {
            SubscriptionRecord(client: client, name: $0, kind: .ids([]))
        }
        var queue = OutputQueue()
        var expected: [UInt8] = []
        var taken: [[OutputChunk]] = []
        var expectedTakes: [(bytes: Int, lines: Int)] = []
        var sinceTake = 0, linesSinceTake = 0
        func bytes(_ n: Int, _ tag: Int) -> [UInt8] {
            var b = (0..<n).map { UInt8(truncatingIfNeeded: 0x21 + ($0 &* 7 &+ tag) % 90) }
            if n > 0, tag % 3 == 0 { b[n - 1] = 0x0A }
            return b
        }
        func note(_ b: [UInt8]) {
            expected += b
            sinceTake += b.count
            if b.last == 0x0A { linesSinceTake += 1 }
        }
        var maxBlock = 0
        for step in 0..<4000 {
            switch rng.next() % 10 {
            case 0, 1:
                let n = rng.next() % 10 == 0 ? rng.next() % 70_000 : rng.next() % 300
                let b = bytes(n, step)
                queue.append(b)
                note(b)
            case 2, 3:
                let s = subs[rng.next() % subs.count]
                let head = bytes(rng.next() % 40 + 1, step), tail = bytes(rng.next() % 900 + 1, step + 1)
                head.withUnsafeBytes { h in tail.withUnsafeBytes { t in queue.appendEvent(head: h, s, tail: t) } }
                var name: [UInt8] = []
                s.appendName(to: &name)
                let whole = head + name + tail
                expected += whole
                sinceTake += whole.count
                if tail.last == 0x0A { linesSinceTake += 1 }
            case 4, 5:
                let n = rng.next() % 500
                let text = String(repeating: "w", count: n)
                queue.write { w in w.string(text); w.raw("\n") }
                var w = JSONWriter()
                w.string(text)
                w.raw("\n")
                note(w.bytes)
            case 6, 7:
                // Small payloads are copied, large ones referenced.
                let b = bytes(rng.next() % 2 == 0 ? rng.next() % OutputQueue.copyLimit : OutputQueue.copyLimit + rng.next() % 5000, step)
                queue.append(shared: OutputBytes.copy(b))
                note(b)
            default:
                #expect(queue.byteCount == sinceTake)
                #expect(queue.lineCount == linesSinceTake)
                expectedTakes.append((sinceTake, linesSinceTake))
                let chunks = queue.take()
                #expect(chunks.reduce(0) { $0 + $1.count } == sinceTake)
                #expect(queue.isEmpty && queue.byteCount == 0 && queue.lineCount == 0)
                taken.append(chunks)
                sinceTake = 0
                linesSinceTake = 0
            }
            maxBlock = max(maxBlock, queue.blockCapacity)
        }
        taken.append(queue.take())
        var got: [UInt8] = []
        for chunks in taken {
            for c in chunks { got += UnsafeRawBufferPointer(start: c.base, count: c.count) }
        }
        #expect(got.count == expected.count)
        // The first byte that differs (not the arrays: a failure would print megabytes).
        let firstDifference = zip(got, expected).enumerated().first { $0.element.0 != $0.element.1 }?.offset
        #expect(firstDifference == nil)
        // Blocks grow while filled between takes, up to the cap (a single
        // bigger write gets a block of its own size).
        #expect(maxBlock <= 70_000 + OutputQueue.minBlock)
        #expect(maxBlock >= OutputQueue.maxBlock / 2)
    }

    @Test func eventHeadersWrittenInPlaceAreTheWritersBytes() {
        let client = ClientSession(id: 1, flow: ConnectionFlow())
        var rng = SplitMix(seed: 5)
        let names = ["k0", "", "a name with spaces", String(repeating: "x", count: 300), "é and ü", "q\"uote", "back\\slash"]
        for name in names {
            let s = SubscriptionRecord(client: client, name: name, kind: .ids([]))
            for seq in [0, 9, 10, 99, 100, 123_456_789, Int.max, rng.next()] {
                var queue = OutputQueue()
                let inPlace = queue.appendEventHeader("update", s, seq: seq)
                #expect(inPlace == s.nameIsPlain)
                guard inPlace else { continue }
                var w = JSONWriter()
                w.raw("{\"event\":\"update\",\"sub\":")
                s.writeName(&w)
                w.raw(",\"seq\":")
                w.int(seq)
                #expect(queue.byteCount == w.bytes.count)
                let got = queue.take().flatMap { Array(UnsafeRawBufferPointer(start: $0.base, count: $0.count)) }
                #expect(got == w.bytes)
            }
        }
    }

    /// A fan-out's event (the shared head and tail around each
    /// subscription's name) is the writer's bytes, for short (inline) and
    /// long names, plain or escaped, across block boundaries.
    @Test func fanOutEventsWrittenInPlaceAreTheWritersBytes() {
        let client = ClientSession(id: 1, flow: ConnectionFlow())
        let names = ["k0", "", "a name of more than fifteen bytes", String(repeating: "x", count: 300), "é and ü", "q\"uote"]
        let head = Array("{\"event\":\"update\",\"sub\":".utf8)
        let tail = Array(",\"seq\":42,\"model\":{\"id\":\"Doc:1\"}}\n".utf8)
        var queue = OutputQueue()
        var expected: [UInt8] = []
        for round in 0..<40 {
            for name in names {
                let s = SubscriptionRecord(client: client, name: name + String(round), kind: .ids([]))
                head.withUnsafeBytes { h in tail.withUnsafeBytes { t in queue.appendEvent(head: h, s, tail: t) } }
                var w = JSONWriter()
                w.raw(head)
                s.writeName(&w)
                w.raw(tail)
                expected += w.bytes
            }
        }
        #expect(queue.byteCount == expected.count && queue.lineCount == 40 * names.count)
        let got = queue.take().flatMap { Array(UnsafeRawBufferPointer(start: $0.base, count: $0.count)) }
        #expect(got == expected)
    }

    /// A rid-less mutation's answer written in place is the writer's line,
    /// at every digit count, across block boundaries (many in one queue).
    @Test func responsesWrittenInPlaceAreTheWritersBytes() {
        var rng = SplitMix(seed: 6)
        var queue = OutputQueue()
        var expected: [UInt8] = []
        var seqs = [0, 9, 10, 99, 100, 123_456_789, Int.max]
        for _ in 0..<300 { seqs.append(Int(rng.next() % 1_000_000_007)) }
        for seq in seqs {
            queue.appendResponse(seq: seq)
            var w = JSONWriter()
            w.raw("{\"rid\":")
            w.value(.null)
            w.raw(",\"ok\":true")
            w.key("seq")
            w.int(seq)
            w.raw("}\n")
            expected += w.bytes
        }
        #expect(queue.byteCount == expected.count && queue.lineCount == seqs.count)
        let got = queue.take().flatMap { Array(UnsafeRawBufferPointer(start: $0.base, count: $0.count)) }
        #expect(got == expected)
    }

    @Test func aQuietConnectionKeepsAtMostASmallBlock() {
        var queue = OutputQueue()
        // A burst grows the blocks...
        for _ in 0..<200 { queue.append([UInt8](repeating: 0x61, count: 1000)) }
        #expect(queue.blockCapacity >= 16 << 10)
        _ = queue.take()
        // ...and a quiet connection's next blocks start small again.
        for _ in 0..<12 {
            queue.append([0x62, 0x0A])
            _ = queue.take()
        }
        queue.append([0x63, 0x0A])
        #expect(queue.blockCapacity <= 4 * OutputQueue.minBlock)
        #expect(queue.take().reduce(0) { $0 + $1.count } == 2)
    }
}
