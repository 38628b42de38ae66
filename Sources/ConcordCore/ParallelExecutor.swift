public import ConcordJSON

/// Runs independent work items, possibly in parallel, and returns when all
/// are done. The core calls it with items that touch disjoint state.
public protocol ParallelExecutor: AnyObject {
    /// How many threads take part (1 means inline).
    var width: Int { get }
    /// Calls `body(i)` once for every `i` in `0..<count`, and returns when all are done.
    /// (`body` is escaping only so it can be handed to other threads; it is not kept.)
    func forEach(_ count: Int, _ body: @escaping (Int) -> Void)
    /// What `stats` shows of it (`parallel`), nil for none; called on the
    /// thread that calls `forEach`.
    var statsJSON: JSON? { get }
}

extension ParallelExecutor {
    public var statsJSON: JSON? { nil }
}

/// Runs everything on the caller's thread (tests, `--threads 1`).
public final class InlineExecutor: ParallelExecutor {
    public init() {}
    public var width: Int { 1 }
    public func forEach(_ count: Int, _ body: @escaping (Int) -> Void) {
        for i in 0..<count { body(i) }
    }
}
