import ConcordCore
import ConcordJSON
import Logging

/// Cluster mode with a local backend (`--cache sqlite`, or any plugin): the
/// host's own copy of the log's state on its disk, so that a restarted host
/// resumes from it and reads only what follows, instead of loading a
/// snapshot from Redis or replaying the log from its start.
///
/// What is stored is the host's cluster snapshot (the bytes whose checksum
/// is its state digest, ``ClusterSnapshot``), at every snapshot point and
/// when the host stops cleanly, in chunks, with a manifest stamped with the
/// log position `(epoch, offset, stream id, chain hash, seq)` — all in one
/// `write_batch`, so the manifest never describes chunks of another state.
/// A restart uses it only when the log still holds what follows: the same
/// epoch, and the entry after `offset` continues the chain from `hash` (or
/// the head is `offset` with that hash). Else the host joins as a new one.
///
/// Keys: `x:cluster` (the manifest) and `x:cluster:N` (chunks); nothing else
/// of the backend is read or written in cluster mode. Used by one thread at a
/// time: start-up reads before the loop runs; stores come from the snapshot
/// thread, one at a time; `close` after both.
final class ClusterLocalCopy: @unchecked Sendable {
    // Sendable: see above — start-up, then the snapshot thread (one at a
    // time, `Sequencer.snapshotting`), then shutdown; never two at once.
    struct Stored {
        var offset: Int
        var streamID: String
        var hash: String
        var epoch: String
        var seq: Int
        var bytes: [UInt8]
    }

    static let manifestKey = "x:cluster"
    static let chunkBytes = 1 << 20

    private let backend: Backend
    private let cluster: String
    private let logger: Logger
    /// Chunks the stored manifest names (so a smaller state deletes the surplus in the same batch).
    private var storedChunks = 0
    private(set) var storedOffset = 0
    private var lastError: String?

    init(backend: Backend, cluster: String, logger: Logger) {
        self.backend = backend
        self.cluster = cluster
        self.logger = logger
    }

    /// The stored state, when there is one for this cluster that checks out.
    func read() -> Stored? {
        do {
            guard let m = try backend.get(Array(Self.manifestKey.utf8)) else { return nil }
            guard let v = try? JSONParser(maxDepth: 8).parse(m), v["v"] == 1,
                  let name = v["cluster"]?.stringValue, let offset = v["offset"]?.numberValue?.intValue,
                  let streamID = v["stream_id"]?.stringValue, let hash = v["hash"]?.stringValue, let epoch = v["epoch"]?.stringValue,
                  let seq = v["seq"]?.numberValue?.intValue, let chunks = v["chunks"]?.numberValue?.intValue,
                  let length = v["length"]?.numberValue?.intValue, let sum = v["sum"]?.stringValue else {
                logger.warning("the local copy's manifest does not decode; joining the cluster without it")
                return nil
            }
            storedChunks = chunks
            guard name == cluster else {
                logger.warning("the local copy belongs to another cluster; joining without it", metadata: ["concord.local_cluster": "\(name)"])
                return nil
            }
            var bytes: [UInt8] = []
            bytes.reserveCapacity(length)
            for i in 0..<chunks {
                guard let c = try backend.get(Array("\(Self.manifestKey):\(i)".utf8)) else { break }
                bytes.append(contentsOf: c)
            }
            guard bytes.count == length, ClusterLink.fnvHex(bytes) == sum else {
                logger.error("the local copy is damaged (length or checksum); joining the cluster without it", metadata: ["concord.offset": "\(offset)"])
                return nil
            }
            storedOffset = offset
            return Stored(offset: offset, streamID: streamID, hash: hash, epoch: epoch, seq: seq, bytes: bytes)
        } catch {
            logger.error("cannot read the local copy; joining the cluster without it", metadata: ["concord.error": "\(error)"])
            return nil
        }
    }

    /// Stores a snapshot (already encoded, with its checksum) as the local copy, atomically.
    func store(_ snap: ClusterSnapshot, bytes: [UInt8], sum: String) {
        guard snap.offset > 0, snap.offset != storedOffset || storedChunks == 0 else { return }
        let started = monotonicSeconds()
        var writes: [(key: [UInt8], value: [UInt8]?)] = []
        var i = 0
        var at = 0
        while at < bytes.count {
            let end = min(bytes.count, at + Self.chunkBytes)
            writes.append((Array("\(Self.manifestKey):\(i)".utf8), Array(bytes[at..<end])))
            at = end
            i += 1
        }
        let chunks = i
        for surplus in chunks..<max(chunks, storedChunks) { writes.append((Array("\(Self.manifestKey):\(surplus)".utf8), nil)) }
        var w = JSONWriter(capacity: 256)
        w.raw("{\"v\":1,\"cluster\":"); w.string(cluster)
        w.raw(",\"epoch\":"); w.string(snap.epoch)
        w.raw(",\"offset\":"); w.int(snap.offset)
        w.raw(",\"stream_id\":"); w.string(snap.streamID)
        w.raw(",\"hash\":"); w.string(snap.hash)
        w.raw(",\"seq\":"); w.int(snap.seq)
        w.raw(",\"chunks\":"); w.int(chunks)
        w.raw(",\"length\":"); w.int(bytes.count)
        w.raw(",\"sum\":"); w.string(sum)
        w.raw("}")
        writes.append((Array(Self.manifestKey.utf8), w.bytes))
        do {
            try backend.writeBatch(writes)
        } catch {
            // The previous copy stays whole (one batch); the next snapshot point tries again.
            if lastError != error.description {
                logger.error("cannot store the local copy of the cluster state", metadata: ["concord.error": "\(error)", "concord.offset": "\(snap.offset)"])
            }
            lastError = error.description
            return
        }
        lastError = nil
        storedChunks = chunks
        storedOffset = snap.offset
        logger.info("cluster state stored in the local copy", metadata: [
            "concord.offset": "\(snap.offset)", "concord.bytes": "\(bytes.count)",
            "concord.ms": "\(Int((monotonicSeconds() - started) * 1000))",
        ])
    }

    func close() { backend.close() }
}
