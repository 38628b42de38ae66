import ConcordJSON
import ConcordProtocol
import Synchronization
import Testing

@testable import ConcordCore

/// Drives an ``Engine`` on one thread, as the server does, and reads back
/// what each connection would receive.
final class EngineHarness {
    let engine: Engine
    private var nextID = 1
    fileprivate var conns: [ConnectionID: TestConn] = [:]

    init(configuration: EngineConfiguration = EngineConfiguration(), executor: any ParallelExecutor = InlineExecutor()) {
        // Every core test runs with the internal checks on.
        var configuration = configuration
        configuration.internalChecks = true
        engine = Engine(configuration: configuration, executor: executor)
    }

    func connect() -> TestConn {
        let id = nextID
        nextID += 1
        let c = TestConn(id: id, harness: self)
        engine.open(id, flow: c.flow)
        conns[id] = c
        return c
    }

    func pumpPublic() { pump() }

    /// Like the sequencer between turns: a small slice of deferred work
    /// (unfiling dropped query views) after every request, so the tests run
    /// with views half unfiled while updates go on.
    var deferredUnitsPerRequest = 3

    /// Lines parsed and decoded as the server's long-line thread does
    /// (``Engine/parse(_:parser:decodeWith:)``), not by the engine.
    var decodesOffTheSequencer = false

    fileprivate func pump() {
        if engine.hasDeferredWork { engine.doDeferredWork(units: deferredUnitsPerRequest) }
        for (id, segments) in engine.takeOutput() {
            guard let c = conns[id] else { continue }
            for s in segments { c.unread.append(contentsOf: UnsafeRawBufferPointer(start: s.base, count: s.count)) }
            if !c.slow { c.readAll() }
        }
    }
}

final class TestConn {
    let id: ConnectionID
    unowned let harness: EngineHarness
    fileprivate var raw: [UInt8] = []
    /// Bytes handed over by the engine that the "socket" has not taken yet.
    fileprivate var unread: [UInt8] = []
    let flow = ConnectionFlow()
    /// A slow reader: output stays unread (and counts as unsent) until `readAll()`.
    var slow = false
    /// Events received and not yet taken, in order.
    var events: [JSON] = []
    var responses: [JSON] = []

    init(id: ConnectionID, harness: EngineHarness) {
        self.id = id
        self.harness = harness
    }

    /// The socket takes everything handed over; like the server's loop, the
    /// engine hears when a coalescing episode's output has drained.
    func readAll() {
        flow.unsent.subtract(unread.count, ordering: .relaxed)
        raw.append(contentsOf: unread)
        unread = []
        split()
        let episode = flow.coalescing.load(ordering: .relaxed)
        if episode != 0 && flow.unsent.load(ordering: .relaxed) <= harness.engine.configuration.outputSoftBytes / 2 {
            harness.engine.outputDrained(id, episode: episode)
            harness.pump()
            readAll()
        }
    }

    var unreadBytes: Int { unread.count }

    fileprivate func split() {
        while let nl = raw.firstIndex(of: 0x0A) {
            let line = Array(raw[..<nl])
            raw.removeSubrange(...nl)
            let v = try! JSONParser(maxDepth: 100_000).parse(line)
            if v["event"] != nil { events.append(v) } else { responses.append(v) }
        }
    }

    /// Sends one line and returns its response.
    @discardableResult
    func send(_ line: String) -> JSON {
        if harness.decodesOffTheSequencer {
            let e = harness.engine
            e.handle(Engine.parse(Array(line.utf8), parser: e.lineParser, decodeWith: e.configuration.idKey), from: id)
        } else {
            harness.engine.handleLine(Array(line.utf8), from: id)
        }
        harness.pump()
        if slow { readAll() }
        return responses.removeLast()
    }

    /// Sends one line that may not be answered at once (a `min_seq` wait).
    func post(_ line: String) {
        harness.engine.handleLine(Array(line.utf8), from: id)
        harness.pump()
    }

    /// Takes the responses received so far.
    func takeResponses() -> [JSON] {
        defer { responses = [] }
        return responses
    }

    /// Sends and requires `ok: true`.
    @discardableResult
    func ok(_ line: String, sourceLocation: SourceLocation = #_sourceLocation) -> JSON {
        let r = send(line)
        #expect(r["ok"] == true, "expected ok for \(line), got \(r.compactString)", sourceLocation: sourceLocation)
        return r
    }

    /// Sends and returns the error code.
    func error(_ line: String) -> String? {
        let r = send(line)
        return r["error"]?["code"]?.stringValue
    }

    /// Takes every event received so far.
    func take() -> [JSON] {
        defer { events = [] }
        return events
    }

    func close() { harness.engine.close(id) }
}

func json(_ s: String) -> JSON { try! JSONParser().parse(s) }
