import ConcordJSON

/// What the map step made for one job.
enum Rendered {
    /// Nothing to send (an ended view, an unchanged key, an empty change list).
    case none
    case model(ModelRender)
    /// One payload shared by every subscriber of the job's view or entity.
    case payload(OutputBytes, changed: Bool)
}

/// The outcome of rendering one model view for one mutation.
struct ModelRender {
    var newIDs: Set<String>? = nil
    /// The body of the view's `update` event, shared by its subscribers.
    var payload: OutputBytes? = nil
    /// The three flags below in one byte: the result is copied into and out
    /// of a `RenderResults` slot, which stays a plain copy at this size.
    private var flags: UInt8 = 0

    /// The tree's root entity was deleted: every subscriber gets `delete`.
    var ended: Bool {
        get { flags & 1 != 0 }
        set { flags = newValue ? flags | 1 : flags & ~1 }
    }
    /// The tree is not what it was (an event forced by `force` has it false).
    var changed: Bool {
        get { flags & 2 != 0 }
        set { flags = newValue ? flags | 2 : flags & ~2 }
    }
    /// Changed or forced, but its only subscriber gets no event (paused,
    /// or the writer's own): no body was written.
    var unsent: Bool {
        get { flags & 4 != 0 }
        set { flags = newValue ? flags | 4 : flags & ~4 }
    }
}

/// The map step's output: one slot per job, each written by exactly one
/// work item (possibly on another thread), read by the enqueue step after
/// the executor returned. Owns its memory; the slots are never resized
/// while the step runs. The engine keeps one and resets it per mutation
/// (no allocation per mutation once it is big enough).
final class RenderResults: @unchecked Sendable {
    // Sendable: slot i is written only by item i, and read only after the
    // executor's forEach returned (which orders the writes before the reads);
    // scratch i likewise is touched only by item i during the step, and
    // grown only in `reset`, before it.
    private var slots: UnsafeMutablePointer<Rendered>
    private var capacity: Int
    private(set) var count: Int

    /// What the item of index i keeps from one mutation to the next: its
    /// writer's buffer and a block for a short payload (no allocation per
    /// job once they exist). For the first `scratchKept` indices only: the
    /// memory kept is bounded whatever a mutation's number of jobs.
    private struct Scratch {
        var buffer: [UInt8] = []
        var small: OutputBytes?
    }
    static let scratchKept = 1024
    private var scratch: UnsafeMutablePointer<Scratch> = .allocate(capacity: 0)
    private var scratchCount = 0

    init(count: Int) {
        self.count = count
        capacity = Swift.max(count, 1)
        slots = .allocate(capacity: capacity)
        slots.initialize(repeating: .none, count: count)
    }

    /// The writer's buffer item `i` used last time (empty the first time).
    func takeBuffer(_ i: Int) -> [UInt8] {
        guard i < scratchCount else { return [] }
        var b: [UInt8] = []
        swap(&b, &scratch[i].buffer)
        return b
    }

    /// Keeps item `i`'s buffer (emptied) for its next use, unless it grew past `limit`.
    func keepBuffer(_ i: Int, _ buffer: inout [UInt8], limit: Int) {
        guard i < scratchCount, buffer.capacity <= limit else { return }
        buffer.removeAll(keepingCapacity: true)
        swap(&buffer, &scratch[i].buffer)
    }

    /// A block of `OutputQueue.copyLimit` bytes for item `i`'s short
    /// payload: the one it used last time when nothing holds it any more
    /// (every queue copies a payload that short, so after the previous
    /// mutation's enqueue step nothing does; the check keeps a held one
    /// from being written over all the same), else a new one.
    func smallBlock(_ i: Int) -> OutputBytes {
        guard i < scratchCount else { return OutputBytes.block(capacity: OutputQueue.copyLimit) }
        if scratch[i].small != nil, isKnownUniquelyReferenced(&scratch[i].small) { return scratch[i].small! }
        let b = OutputBytes.block(capacity: OutputQueue.copyLimit)
        scratch[i].small = b
        return b
    }

    /// Empties every slot (releasing what it held) and makes `n` empty ones.
    func reset(count n: Int) {
        let want = Swift.min(n, Self.scratchKept)
        if want > scratchCount {
            let grown = UnsafeMutablePointer<Scratch>.allocate(capacity: want)
            grown.moveInitialize(from: scratch, count: scratchCount)
            (grown + scratchCount).initialize(repeating: Scratch(), count: want - scratchCount)
            scratch.deallocate()
            scratch = grown
            scratchCount = want
        }
        slots.destroy(count: count)
        if n > capacity {
            slots.deallocate()
            capacity = Swift.max(n, capacity * 2)
            slots = .allocate(capacity: capacity)
        }
        slots.initialize(repeating: .none, count: n)
        count = n
    }

    deinit {
        slots.deinitialize(count: count)
        slots.deallocate()
        scratch.deinitialize(count: scratchCount)
        scratch.deallocate()
    }

    subscript(i: Int) -> Rendered {
        get { slots[i] }
        set { slots[i] = newValue }
    }
}

extension Engine {
    /// Step two: every job's bytes, on the worker pool when there are
    /// several. Each item reads the store and its own view (nothing else
    /// writes them during the step) and writes only its own slot.
    /// `valueChanged`: the mutation's `StoreChange.valueChanged` (an entity
    /// not in it shows the same value before and after it in any document).
    func mapRender(_ plan: RenderPlan, effects: [ViewEffect], seq: Int, origins: Set<ObjectIdentifier>, context: JSON?,
                   valueChanged: ChangeSet) -> RenderResults {
        let results = renderResults
        results.reset(count: plan.jobs.count)
        guard plan.renders else { return results }
        let jobs = plan.jobs
        // One job (a key's or a model's view, shared by its subscribers)
        // runs here: the closure the executor takes is escaping, and its
        // context was an allocation per mutation.
        // Its writer's buffer is the engine's, kept from one mutation to the next.
        if jobs.count == 1 {
            var buffer = renderBuffer
            renderBuffer = []
            results[0] = renderJob(jobs[0], effects: effects, seq: seq, origins: origins, context: context, valueChanged: valueChanged,
                                   buffer: &buffer, slot: -1)
            if buffer.capacity <= OutputQueue.scratchLimit * 16 { renderBuffer = buffer }
            return results
        }
        // Each item's buffer and short-payload block are its index's, kept in `results`.
        executor.forEach(jobs.count) { i in
            var buffer = results.takeBuffer(i)
            results[i] = self.renderJob(jobs[i], effects: effects, seq: seq, origins: origins, context: context, valueChanged: valueChanged,
                                        buffer: &buffer, slot: i)
            results.keepBuffer(i, &buffer, limit: OutputQueue.scratchLimit)
        }
        return results
    }

    /// A writer over `buffer` (empty: `payload` leaves it so) with room for `capacity` bytes.
    func writer(_ buffer: inout [UInt8], capacity: Int) -> JSONWriter {
        var w = JSONWriter(adopting: buffer)
        buffer = []
        if w.bytes.capacity < capacity { w.bytes.reserveCapacity(capacity) }
        return w
    }

    /// The bytes `w` wrote, as the job's payload; its buffer, emptied, goes back to `buffer`.
    @inline(__always)
    private func payload(_ w: inout JSONWriter, _ buffer: inout [UInt8], changed: Bool, slot: Int) -> Rendered {
        .payload(payloadBytes(&w, &buffer, slot: slot), changed: changed)
    }

    /// The bytes `w` wrote, as one block every subscriber's queue can take;
    /// the writer's buffer, emptied, goes back to `buffer`. A short payload
    /// goes into a block kept for the job's `slot` (`RenderResults.smallBlock`),
    /// or, for the mutation's only job (`slot` −1, rendered on the
    /// sequencer), into the engine's `smallPayload`, when nothing holds it
    /// any more.
    @inline(__always)
    func payloadBytes(_ w: inout JSONWriter, _ buffer: inout [UInt8], slot: Int) -> OutputBytes {
        let n = w.bytes.count
        let out: OutputBytes
        if n <= OutputQueue.copyLimit && slot < 0 && isKnownUniquelyReferenced(&smallPayload) {
            out = smallPayload
            fill(out, from: w.bytes)
        } else if n <= OutputQueue.copyLimit && slot >= 0 {
            out = renderResults.smallBlock(slot)
            fill(out, from: w.bytes)
        } else {
            out = OutputBytes.copy(w.bytes)
        }
        w.bytes.removeAll(keepingCapacity: true)
        swap(&buffer, &w.bytes)
        return out
    }

    /// `bytes` into the start of `block` (at least as long), and its count.
    @inline(__always)
    private func fill(_ block: OutputBytes, from bytes: [UInt8]) {
        bytes.withUnsafeBytes { src in
            if let s = src.baseAddress { block.base.copyMemory(from: s, byteCount: src.count) }
        }
        block.header = bytes.count
    }

    private func renderJob(_ job: RenderPlan.Job, effects: [ViewEffect], seq: Int, origins: Set<ObjectIdentifier>, context: JSON?,
                           valueChanged: ChangeSet, buffer: inout [UInt8], slot: Int) -> Rendered {
        switch job {
        case .model(let view):
            return .model(renderModel(view, effects, context: context, origins: origins, buffer: &buffer, slot: slot))
        case .key(let view, let forced, let ended, let known):
            if ended { return .none }
            // Running subscribers of a key always hold the document as of the
            // last mutation, so "what they last got" is the store's value before
            // this one (the view keeps no copy).
            let (doc, old) = store.documentRecordNowAndBefore(view.key)
            let new = doc?.value
            assert(known == nil || known! == (old != new), "a net change set says whether the document changed")
            let changed = known ?? (old != new)
            guard forced || changed else { return .none }
            // Room for a few hundred bytes of document without growing (the
            // writer doubles: 256 would copy once for a 250-byte document).
            var w = writer(&buffer, capacity: 512)
            // Both are the store's (materialized) document: an entity the
            // mutation did not change has one value in both, not compared.
            // A document that is one entity, holding the same unchanged
            // entities before and after: the entity is all that changed
            // (most key documents).
            var known: String?
            if changed, let doc, let root = store.root(following: doc) {
                // The update's own document, which apply found to be its root
                // entity's value before and after: no identity read or looked up.
                if store.isSoleChange(root.record, valueChanged: valueChanged) { known = root.id }
                if configuration.internalChecks, let new {
                    let general = store.soleChangedEntity(new, valueChanged: valueChanged)
                    let oldID = old?.objectValue?.identity(idKey: tree.idKey)
                    let expected = general != nil && oldID == general ? general : nil
                    if expected != known {
                        preconditionFailure("Concord internal check failed: document '\(view.key)' of its root entity: \(known ?? "-") against \(expected ?? "-")")
                    }
                }
            } else if changed, let new, let id = store.soleChangedEntity(new, valueChanged: valueChanged), case .object(let o)? = old,
               o.identity(idKey: tree.idKey) == id {
                known = id
            }
            // Under the internal checks (tests, fuzzers), against the walk.
            if configuration.internalChecks, let id = known, tree.diff(old: old, new: new) != ([id], []) {
                preconditionFailure("Concord internal check failed: the document of entity '\(id)' changed more than the entity")
            }
            writeDocumentBody(&w, old: old, new: new, context: context, valueChanged: valueChanged, onlyChanged: known)
            return payload(&w, &buffer, changed: changed, slot: slot)
        case .list(let view, let ended, let changed, let changes):
            guard !ended && !changes.isEmpty else { return .none }
            var w = writer(&buffer, capacity: 256)
            writeCollectionBody(&w, name: view.name, changes: changes, context: context)
            return payload(&w, &buffer, changed: changed, slot: slot)
        case .entity(let id, let changed):
            var w = writer(&buffer, capacity: 256)
            writeEntityBody(&w, id: id, value: store.entity(id) ?? .null, context: context)
            return payload(&w, &buffer, changed: changed, slot: slot)
        }
    }
}
