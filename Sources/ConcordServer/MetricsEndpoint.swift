import CLibUV
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// `--metrics HOST:PORT`: a minimal HTTP/1.1 endpoint on the loop that
/// answers `GET /metrics` with Prometheus's text format and closes.
///
/// Bounded like everything else: at most ``maxExchanges`` connections at
/// once, a request head of at most 8 KiB sent within ``headTimeoutMs``, and
/// ``timeoutMs`` in all. Idle connections cannot take the slots away from
/// real scrapes: when every slot is taken, the oldest connection that has
/// not sent its request head yet is closed to make room (only when every
/// slot waits for the core's text does a new one get 503). The text is made on the sequencer (``Sequencer/Input/metrics``)
/// so the core's figures are read on their own thread; the loop only moves
/// bytes. Meant for loopback: the figures carry no model data, but anyone
/// who can reach the port can read them.
final class MetricsEndpoint {
    static let maxExchanges = 32
    static let maxHeadBytes = 8192
    static let headTimeoutMs: UInt64 = 2_000
    static let timeoutMs: UInt64 = 10_000

    let loop: UnsafeMutablePointer<uv_loop_t>
    let logger: Logger
    private let requestText: (Int) -> Void
    private var listener: UnsafeMutablePointer<uv_tcp_t>?
    private var exchanges: [Int: Exchange] = [:]
    private var nextToken = 1
    /// Silent connections closed to make room for a scrape.
    private(set) var idleEvictions = 0
    private(set) var address = ""

    /// One scrape: its socket, the request head read so far, a timeout.
    final class Exchange {
        let token: Int
        let tcp: UnsafeMutablePointer<uv_tcp_t>
        let timer: UnsafeMutablePointer<uv_timer_t>
        unowned let endpoint: MetricsEndpoint
        var head: [UInt8] = []
        /// The reply, kept until the write completes.
        var response: UnsafeMutableRawBufferPointer?
        var closing = false
        var headOnly = false
        /// The request head arrived (the exchange waits for the core, or writes).
        var headDone = false

        init(token: Int, endpoint: MetricsEndpoint) {
            self.token = token
            self.endpoint = endpoint
            tcp = .allocate(capacity: 1)
            timer = .allocate(capacity: 1)
        }

        deinit { response?.deallocate() }
    }

    /// `requestText(token)` asks the core for the text; it comes back through ``respond(token:text:)``.
    init(loop: UnsafeMutablePointer<uv_loop_t>, logger: Logger, requestText: @escaping (Int) -> Void) {
        self.loop = loop
        self.logger = logger
        self.requestText = requestText
    }

    var activeExchanges: Int { exchanges.count }

    static func parseAddress(_ text: String) -> (host: String, port: Int32)? { MetricsAddress.parse(text) }

    func listen(_ text: String) throws(StartupError) {
        guard let (host, port) = Self.parseAddress(text) else {
            throw StartupError(description: "--metrics must be HOST:PORT with a numeric address, e.g. 127.0.0.1:9464 or [::1]:9464 (got \(text))")
        }
        var storage = sockaddr_storage()
        let ok = withUnsafeMutablePointer(to: &storage) { p -> Bool in
            p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { (try? uvCall("uv_ip6_addr", uv_ip6_addr(host, port, $0))) != nil }
                || p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { (try? uvCall("uv_ip4_addr", uv_ip4_addr(host, port, $0))) != nil }
        }
        guard ok else { throw StartupError(description: "--metrics: '\(host)' is not an IPv4 or IPv6 address") }
        let t = UnsafeMutablePointer<uv_tcp_t>.allocate(capacity: 1)
        uvMust("uv_tcp_init", uv_tcp_init(loop, t))
        uv_handle_set_data(asHandle(t), Unmanaged.passUnretained(self).toOpaque())
        do {
            try uvCall("uv_tcp_bind", withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { uv_tcp_bind(t, $0, 0) }
            })
            try uvCall("uv_listen", uv_listen(asStream(t), 16) { server, status in
                MetricsEndpoint.from(server).accept(status: status)
            })
        } catch {
            uv_close(asHandle(t)) { h in h?.deallocate() }
            throw StartupError(description: "cannot listen for metrics on \(text): \(error)")
        }
        listener = t
        // The port actually bound (`:0` asks the system for a free one).
        var bound = sockaddr_storage()
        var len = Int32(MemoryLayout<sockaddr_storage>.size)
        var boundPort = port
        withUnsafeMutablePointer(to: &bound) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = try? uvCall("uv_tcp_getsockname", uv_tcp_getsockname(t, $0, &len)) }
            if p.pointee.ss_family == sa_family_t(AF_INET) {
                p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { boundPort = Int32(UInt16(bigEndian: $0.pointee.sin_port)) }
            } else {
                p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { boundPort = Int32(UInt16(bigEndian: $0.pointee.sin6_port)) }
            }
        }
        address = host.contains(":") ? "[\(host)]:\(boundPort)" : "\(host):\(boundPort)"
        logger.info("serving metrics", metadata: ["concord.metrics": "http://\(address)/metrics"])
        if !(host.hasPrefix("127.") || host == "::1") {
            logger.warning("metrics are served on a non-loopback address: anyone who can reach it can read them", metadata: [
                "concord.metrics": "\(text)",
            ])
        }
    }

    /// Stops listening and ends every scrape in progress (shutdown).
    func close() {
        if let l = listener {
            uv_close(asHandle(l)) { h in h?.deallocate() }
            listener = nil
        }
        for e in Array(exchanges.values) { finish(e) }
    }

    private func accept(status: Int32) {
        guard status >= 0, let listener else { return }
        let e = Exchange(token: nextToken, endpoint: self)
        nextToken += 1
        uvMust("uv_tcp_init", uv_tcp_init(loop, e.tcp))
        guard (try? uvCall("uv_accept", uv_accept(asStream(listener), asStream(e.tcp)))) != nil else {
            uv_close(asHandle(e.tcp)) { h in h?.deallocate() }
            e.timer.deallocate()
            return
        }
        uvMust("uv_timer_init", uv_timer_init(loop, e.timer))
        let opaque = Unmanaged.passRetained(e).toOpaque()
        uv_handle_set_data(asHandle(e.tcp), opaque)
        uv_handle_set_data(asHandle(e.timer), opaque)
        if exchanges.count >= Self.maxExchanges {
            // Room for a scrape: close the oldest connection still silent.
            if let idle = exchanges.values.filter({ !$0.headDone && !$0.closing }).min(by: { $0.token < $1.token }) {
                finish(idle)
                idleEvictions += 1
            }
        }
        exchanges[e.token] = e
        if exchanges.count > Self.maxExchanges {
            reply(e, status: "503 Service Unavailable", body: Array("too many scrapes at once\n".utf8))
            return
        }
        startTimer(e, Self.headTimeoutMs)
        do {
            try uvCall("uv_read_start", uv_read_start(asStream(e.tcp), { _, suggested, buf in
                let size = min(suggested, 4096)
                buf!.pointee = uv_buf_t(base: UnsafeMutablePointer<CChar>.allocate(capacity: size), len: size)
            }, { stream, nread, buf in
                let e = Unmanaged<Exchange>.fromOpaque(uv_handle_get_data(asHandle(stream!))!).takeUnretainedValue()
                defer { buf?.pointee.base?.deallocate() }
                e.endpoint.read(e, nread: nread, base: buf?.pointee.base)
            }))
        } catch {
            finish(e)
        }
    }

    private func read(_ e: Exchange, nread: Int, base: UnsafeMutablePointer<CChar>?) {
        guard !e.closing else { return }
        if nread < 0 { return finish(e) }
        guard nread > 0, let base else { return }
        e.head.append(contentsOf: UnsafeRawBufferPointer(start: base, count: nread))
        guard let end = Self.headEnd(e.head) else {
            if e.head.count > Self.maxHeadBytes {
                reply(e, status: "431 Request Header Fields Too Large", body: Array("request head over 8 KiB\n".utf8))
            }
            return
        }
        uvMust("uv_read_stop", uv_read_stop(asStream(e.tcp)))
        e.headDone = true
        startTimer(e, Self.timeoutMs)
        let line = e.head[..<end].split(separator: 0x0D, maxSplits: 1).first.map { String(decoding: $0, as: UTF8.self) } ?? ""
        let parts = line.split(separator: " ")
        guard parts.count == 3, parts[2].hasPrefix("HTTP/1.") else {
            return reply(e, status: "400 Bad Request", body: Array("not an HTTP/1.x request\n".utf8))
        }
        guard parts[0] == "GET" || parts[0] == "HEAD" else {
            return reply(e, status: "405 Method Not Allowed", body: Array("only GET and HEAD\n".utf8), extra: "Allow: GET, HEAD\r\n")
        }
        let path = parts[1].split(separator: "?", maxSplits: 1).first.map(String.init) ?? ""
        guard path == "/metrics" || path == "/" else {
            return reply(e, status: "404 Not Found", body: Array("the metrics are at /metrics\n".utf8))
        }
        e.headOnly = parts[0] == "HEAD"
        requestText(e.token)
    }

    /// (Re)starts the exchange's one timer: when it fires, the exchange closes.
    private func startTimer(_ e: Exchange, _ ms: UInt64) {
        uvMust("uv_timer_start", uv_timer_start(e.timer, { h in
            let e = Unmanaged<Exchange>.fromOpaque(uv_handle_get_data(asHandle(h!))!).takeUnretainedValue()
            e.endpoint.finish(e)
        }, ms, 0))
    }

    /// Where the request head ends (after its blank line), if it has.
    static func headEnd(_ b: [UInt8]) -> Int? {
        guard b.count >= 4 else { return nil }
        for i in 3..<b.count where b[i] == 0x0A && b[i - 1] == 0x0D && b[i - 2] == 0x0A && b[i - 3] == 0x0D { return i + 1 }
        return nil
    }

    /// The core's text for a scrape (the exchange may have timed out meanwhile).
    func respond(token: Int, text: [UInt8]) {
        guard let e = exchanges[token], !e.closing else { return }
        reply(e, status: "200 OK", body: text, contentType: "text/plain; version=0.0.4; charset=utf-8")
    }

    private func reply(_ e: Exchange, status: String, body: [UInt8], contentType: String = "text/plain; charset=utf-8",
                       extra: String = "") {
        guard !e.closing else { return }
        uvMust("uv_read_stop", uv_read_stop(asStream(e.tcp)))
        var head = "HTTP/1.1 \(status)\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.count)\r\n"
        head += extra + "Connection: close\r\n\r\n"
        let bytes = Array(head.utf8) + (e.headOnly ? [] : body)
        let raw = UnsafeMutableRawBufferPointer.allocate(byteCount: bytes.count, alignment: 1)
        raw.copyBytes(from: bytes)
        e.response = raw
        let req = UnsafeMutablePointer<uv_write_t>.allocate(capacity: 1)
        req.pointee.data = Unmanaged.passUnretained(e).toOpaque()
        var buf = uv_buf_t(base: raw.baseAddress!.assumingMemoryBound(to: CChar.self), len: raw.count)
        let rc = uv_write(req, asStream(e.tcp), &buf, 1) { req, _ in
            let e = Unmanaged<Exchange>.fromOpaque(req!.pointee.data).takeUnretainedValue()
            req!.deallocate()
            e.endpoint.finish(e)
        }
        if (try? uvCall("uv_write", rc)) == nil {
            req.deallocate()
            finish(e)
        }
    }

    /// Closes the exchange's socket and timer; the last close releases it.
    private func finish(_ e: Exchange) {
        guard !e.closing else { return }
        e.closing = true
        exchanges[e.token] = nil
        uvMust("uv_timer_stop", uv_timer_stop(e.timer))
        uv_close(asHandle(e.timer)) { h in h?.deallocate() }
        uv_close(asHandle(e.tcp)) { h in
            Unmanaged<Exchange>.fromOpaque(uv_handle_get_data(h!)!).release()
            h?.deallocate()
        }
    }

    fileprivate static func from<T>(_ h: UnsafeMutablePointer<T>?) -> MetricsEndpoint {
        Unmanaged<MetricsEndpoint>.fromOpaque(uv_handle_get_data(asHandle(h!))!).takeUnretainedValue()
    }
}

/// The `--metrics` argument.
public enum MetricsAddress {
    /// Parses `HOST:PORT` (`127.0.0.1:9464`, `[::1]:9464`, `localhost:9464`).
    public static func parse(_ text: String) -> (host: String, port: Int32)? {
        guard let colon = text.lastIndex(of: ":") else { return nil }
        var host = String(text[..<colon])
        guard let port = Int32(text[text.index(after: colon)...]), port >= 0, port < 65536 else { return nil }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        if host == "localhost" { host = "127.0.0.1" }
        return host.isEmpty ? nil : (host, port)
    }
}
