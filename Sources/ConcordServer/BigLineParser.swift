import ConcordCore
import ConcordJSON

/// Parses the few very long request lines (at least ``threshold`` bytes)
/// on a thread of its own, so that parsing a line of megabytes (a 7 MB
/// query, a 16 MiB batch) never holds a sequencer turn: the line's
/// connection waits for its parse (its later lines stay behind it, in
/// order), every other connection goes on. The result comes back to the
/// sequencer as an input like any other.
final class BigLineParser: @unchecked Sendable {
    // Sendable: `queue` and `stopped` are guarded by `condition`; `parser` is immutable.
    static let threshold = 256 << 10

    private let condition = Condition()
    private var queue: [(id: ConnectionID, line: [UInt8])] = []
    private var garbage: [Engine.ParsedLine] = []
    private var stopped = false
    private var started = false
    private let parser: JSONParser
    private let done: @Sendable (ConnectionID, Engine.ParsedLine) -> Void

    init(parser: JSONParser, done: @escaping @Sendable (ConnectionID, Engine.ParsedLine) -> Void) {
        self.parser = parser
        self.done = done
    }

    /// Queues a line; its parse is reported through `done`.
    func submit(_ id: ConnectionID, _ line: [UInt8]) {
        condition.lock()
        queue.append((id, line))
        if !started {
            started = true
            startThread(name: "concord-parse") { [self] in self.run() }
        }
        condition.unlock()
        condition.signal()
    }

    /// Takes the sequencer's reference to a long line's parse once it was
    /// handled: freeing a tree of a million values takes tens of
    /// milliseconds, which happens here instead of in a turn.
    func discard(_ parsed: Engine.ParsedLine) {
        condition.lock()
        garbage.append(parsed)
        condition.unlock()
        condition.signal()
    }

    func stop() {
        condition.lock()
        stopped = true
        condition.unlock()
        condition.signal()
    }

    private func run() {
        while true {
            condition.lock()
            while queue.isEmpty && garbage.isEmpty && !stopped { condition.wait() }
            if stopped {
                condition.unlock()
                return
            }
            var drop: [Engine.ParsedLine] = []
            swap(&drop, &garbage)
            let next = queue.isEmpty ? nil : queue.removeFirst()
            condition.unlock()
            drop = []
            if let (id, line) = next { done(id, Engine.parse(line, parser: parser)) }
        }
    }
}
