import ConcordJSON

/// What a paused subscription remembers until it resumes — paused by its
/// client (`pause`), or held back because its connection is not reading fast
/// enough (PROTOCOL.md §6.6: coalescing). Both keep exactly what a `resume`
/// would send; a subscription can be both at once.
final class PauseState {
    /// Paused by the client's `pause`.
    var byUser = false
    /// Held back while its connection coalesces.
    var byCongestion = false
    /// Listed in its client's `coalesced` (changed while coalescing).
    var listed = false
    /// Set when the view changed while paused; `context` is then the context
    /// of the last such mutation (nil when it had none).
    var changed = false
    var context: JSON?
    /// Key views: the document last sent before the pause (nil: no document).
    var document: JSON?
    /// Collection and query views: the list (window) last sent before the pause.
    var items: [JSON] = []
    /// Query views: the count last sent before the pause.
    var count = 0
    /// `ids`/`feed` views: each entity changed while paused, with the value
    /// this subscription was last sent (null: absent), in order of first change.
    var entities: [String: JSON] = [:]
    var order: [String] = []
}
