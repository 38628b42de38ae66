// Requests that arrive alone: what waking the server costs.

import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// One client sends a request every `gap` seconds and waits for each
/// answer, `count` times: the server's CPU per request when every request
/// arrives alone (nothing to batch it with). For Redis that is one thread
/// woken by the socket; for Concord the loop is woken by the socket and
/// wakes the sequencer, which wakes the loop again to write the answer.
/// A `ping` costs the engine almost nothing, so Concord's figure is the
/// hand-off's floor under every workload whose requests arrive alone (the
/// live-query rows at 5k updates/s, one update at a time).
/// Returns server CPU µs per request.
func aloneCPU(server: ServerProc, socket: String, request: String, count: Int, gap: Double) throws -> Double {
    let c = try Conn(socket)
    let bytes = Array(request.utf8)
    // Warm up (the server's first requests allocate its lists).
    for _ in 0..<100 {
        c.write(bytes)
        guard c.readLine() != nil else { throw BenchError("no answer to \(request)") }
    }
    let cpu0 = cpuSeconds(server.pid)
    let start = nowNanos()
    for i in 0..<count {
        c.write(bytes)
        guard c.readLine() != nil else { throw BenchError("no answer to \(request)") }
        let due = start + UInt64(Double(i + 1) * gap * 1e9)
        let now = nowNanos()
        if due > now { usleep(UInt32((due - now) / 1000)) }
    }
    return (cpuSeconds(server.pid) - cpu0) / Double(count) * 1e6
}
