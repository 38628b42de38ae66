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
    private var queue: [(id: ConnectionID, line: ArraySlice<UInt8>)] = []
    private var garbage: [any Sendable] = []
    private var stopped = false
    private var started = false
    private let parser: JSONParser
    private let idKey: String
    private let done: @Sendable (ConnectionID, Engine.ParsedLine) -> Void

    /// `idKey`: the engine's, to decode each line into its request here
    /// (and prepare its query), not on the sequencer.
    init(parser: JSONParser, idKey: String, done: @escaping @Sendable (ConnectionID, Engine.ParsedLine) -> Void) {
        self.parser = parser
        self.idKey = idKey
        self.done = done
    }

    /// Queues a line; its parse is reported through `done`.
    func submit(_ id: ConnectionID, _ line: ArraySlice<UInt8>) {
        condition.lock()
        queue.append((id, line))
        startIfNeeded()
        condition.unlock()
        condition.signal()
    }

    /// Called with `condition` locked.
    private func startIfNeeded() {
        guard !started else { return }
        started = true
        startThread(name: "concord-parse") { [self] in self.run() }
    }

    /// Takes the sequencer's references to a long line's parse once it was
    /// handled, and to what the engine kept to free (``Engine/takeGarbage()``):
    /// freeing a tree of a million values takes tens of milliseconds, which
    /// happens here instead of in a turn.
    func discard(_ items: [any Sendable]) {
        guard !items.isEmpty else { return }
        condition.lock()
        garbage.append(contentsOf: items)
        startIfNeeded()
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
            var drop: [any Sendable] = []
            swap(&drop, &garbage)
            let next = queue.isEmpty ? nil : queue.removeFirst()
            condition.unlock()
            drop = []
            if let (id, line) = next { done(id, Engine.parse(line, parser: parser, decodeWith: idKey)) }
        }
    }
}
