import ArgumentParser
import ConcordClient
import ConcordJSON
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `concord`: a command line for concord-server, built on ConcordClient.
@main
struct ConcordCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "concord",
        abstract: "Talk to a concord-server over its Unix socket.",
        discussion: "Output is JSON, one value per line. Errors go to stderr with a non-zero exit status.",
        subcommands: [
            Ping.self, Sync.self, Hello.self, Get.self, Update.self, Delete.self, Batch.self, Collection.self,
            Subscribe.self, Stats.self, Clients.self, Schema.self,
        ]
    )

    /// Accepts `--socket PATH` before the subcommand too (`concord --socket P ping`).
    static func main() async {
        var args = Array(CommandLine.arguments.dropFirst())
        if args.first == "--socket", args.count >= 2 {
            let moved = Array(args[0..<2])
            args.removeFirst(2)
            args += moved
        } else if let first = args.first, first.hasPrefix("--socket=") {
            args.removeFirst()
            args.append(first)
        }
        await main(args)
    }
}

struct ConnectionOptions: ParsableArguments {
    @Option(help: "Server socket (default: $CONCORD_SOCKET, else $XDG_RUNTIME_DIR/concord/concord.sock, else /tmp/concord-<uid>/concord.sock).")
    var socket: String?

    func connect() async throws -> ConcordClient {
        var c = ConcordClient.Configuration(socketPath: socket)
        c.clientName = "concord-cli"
        c.reconnect = false
        return try await ConcordClient.connect(c)
    }
}

// MARK: Helpers

func out(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func parseJSON(_ text: String, what: String) throws -> JSON {
    do {
        return try JSONParser(maxDepth: 10_000).parse(text)
    } catch {
        throw ValidationError("\(what) is not valid JSON: \(error)")
    }
}

/// `text`, or standard input when it is "-".
func argumentOrStdin(_ text: String) -> String {
    guard text == "-" else { return text }
    return String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self)
}

/// Runs `body`, turning errors into one stderr line and exit status 1.
func run(_ body: () async throws -> Void) async throws {
    do {
        try await body()
    } catch let e as ConcordError {
        FileHandle.standardError.write(Data("concord: \(e.code): \(e.message)\n".utf8))
        throw ExitCode(1)
    }
}

// MARK: Commands

/// `--min-seq` / `--timeout-ms` of the reads that may wait for a seq (PROTOCOL §8.3).
struct WaitOptions: ParsableArguments {
    @Option(help: "Answer once this server has applied through this seq (e.g. a write's seq on another cluster host).")
    var minSeq: Int?
    @Option(help: "With --min-seq: give up after this many milliseconds (the server answers unavailable; default 5000).")
    var timeoutMs: Int?

    func validate() throws {
        if timeoutMs != nil && minSeq == nil { throw ValidationError("--timeout-ms goes with --min-seq") }
    }
}

struct Ping: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the last applied mutation's seq.")
    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var wait: WaitOptions
    func run() async throws {
        try await ConcordCLI.run {
            let c = try await connection.connect()
            out(String(try await c.ping(minSeq: wait.minSeq, timeoutMs: wait.timeoutMs)))
        }
    }
}

struct Sync: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Wait until every mutation accepted before it is applied here; print that seq.")
    @OptionGroup var connection: ConnectionOptions
    @Option(help: "Give up after this many milliseconds (the server answers unavailable).") var timeoutMs: Int?
    func run() async throws {
        try await ConcordCLI.run {
            let c = try await connection.connect()
            out(String(try await c.sync(timeoutMs: timeoutMs)))
        }
    }
}

struct Hello: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the server's name, version, protocol and limits.")
    @OptionGroup var connection: ConnectionOptions
    func run() async throws {
        try await ConcordCLI.run {
            let c = try await connection.connect()
            let i = try await c.hello()
            let o: JSON = ["server": .string(i.server), "version": .string(i.version), "protocol": .int(i.protocolVersion),
                           "id_key": .string(i.idKey), "limits": i.limits]
            out(o.compactString)
        }
    }
}

struct Get: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a document, an entity, a collection's items, or a query's window and count.")
    @OptionGroup var connection: ConnectionOptions
    @Option(help: "Cache key of a document.") var key: String?
    @Option(help: "Identity of an entity.") var id: String?
    @Option(help: "Name of a collection.") var collection: String?
    @Option(help: #"A live query (JSON), e.g. '{"type":"Post","where":{"path":"author.id","eq":"Person:1"},"order":[{"path":"date","desc":true}],"limit":20}'; prints {"items":[…],"count":n}."#)
    var query: String?
    @OptionGroup var wait: WaitOptions

    func validate() throws {
        if [key, id, collection, query].compactMap({ $0 }).count != 1 {
            throw ValidationError("give exactly one of --key, --id, --collection, --query")
        }
    }

    func run() async throws {
        try await ConcordCLI.run {
            let c = try await connection.connect()
            let (m, t) = (wait.minSeq, wait.timeoutMs)
            if let key { out((try await c.get(key: key, minSeq: m, timeoutMs: t).model ?? .null).compactString) }
            if let id { out((try await c.get(id: id, minSeq: m, timeoutMs: t).model ?? .null).compactString) }
            if let collection { out(JSON.array(try await c.get(collection: collection, minSeq: m, timeoutMs: t).items).compactString) }
            if let query {
                let spec = try parseJSON(query, what: "--query")
                let r = try await c.get(query: ConcordQuery(raw: spec, type: spec["type"]?.stringValue ?? ""), minSeq: m, timeoutMs: t)
                out((["items": .array(r.items), "count": .int(r.count)] as JSON).compactString)
            }
        }
    }
}

struct Update: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Write a model (JSON, or - for stdin); print the mutation's seq.")
    @OptionGroup var connection: ConnectionOptions
    @Argument(help: "The model as JSON, or - to read it from stdin.") var model: String
    @Option(help: "Also store the tree as the document under this key.") var key: String?
    @Flag(help: "Merge into the stored versions instead of replacing them.") var merge = false
    @Flag(help: "Tell every holder even when nothing changed.") var force = false
    @Option(help: "Context (JSON) delivered with every event.") var context: String?
    @Option(help: "Apply only if nothing it writes changed after this seq (else a conflict error, nothing applied).")
    var ifUnchangedSince: Int?
    @Option(help: "Idempotency token: a retry with the same token is answered with the first seq, not applied again (default: a new one).")
    var token: String?

    func run() async throws {
        let m = try parseJSON(argumentOrStdin(model), what: "the model")
        let ctx = try context.map { try parseJSON($0, what: "--context") }
        try await ConcordCLI.run {
            let c = try await connection.connect()
            out(String(try await c.update(m, key: key, merge: merge, force: force, context: ctx,
                                          ifUnchangedSince: ifUnchangedSince, token: token)))
        }
    }
}

struct Delete: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Delete an entity (--id) or a document (--key).")
    @OptionGroup var connection: ConnectionOptions
    @Option(help: "Identity of the entity.") var id: String?
    @Option(help: "Cache key of the document.") var key: String?

    func validate() throws {
        if (id == nil) == (key == nil) { throw ValidationError("give exactly one of --id, --key") }
    }

    func run() async throws {
        try await ConcordCLI.run {
            let c = try await connection.connect()
            if let id { out(String(try await c.delete(id: id))) }
            if let key { out(String(try await c.delete(key: key))) }
        }
    }
}

struct Batch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Apply mutations atomically: one JSON request object per input line (update, delete, collection.*).")
    @OptionGroup var connection: ConnectionOptions
    @Argument(help: "- to read the mutations from stdin.") var input: String = "-"
    @Option(help: "Context (JSON) delivered with every event.") var context: String?

    func run() async throws {
        var ops: [JSON] = []
        for (n, line) in argumentOrStdin(input).split(separator: "\n").enumerated() {
            let t = line.trimmingCharacters(in: .whitespaces)
            if t.isEmpty { continue }
            ops.append(try parseJSON(t, what: "line \(n + 1)"))
        }
        let ctx = try context.map { try parseJSON($0, what: "--context") }
        try await ConcordCLI.run {
            let c = try await connection.connect()
            var o = JSONObject()
            o["op"] = "batch"
            o["ops"] = .array(ops)
            if let ctx { o["context"] = ctx }
            let r = try await c.request(o)
            out((r["seq"] ?? .null).compactString)
        }
    }
}

struct Collection: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Change an ordered collection.", subcommands: [Set.self, Insert.self, Remove.self, Drop.self])

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Replace the list (a JSON array of entities, or -).")
        @OptionGroup var connection: ConnectionOptions
        @Argument var name: String
        @Argument var items: String
        func run() async throws {
            guard let list = try parseJSON(argumentOrStdin(items), what: "items").arrayValue else { throw ValidationError("items must be a JSON array") }
            try await ConcordCLI.run {
                out(String(try await connection.connect().collectionSet(name, items: list)))
            }
        }
    }

    struct Insert: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Insert entities (a JSON array or one object, or -); append without --index.")
        @OptionGroup var connection: ConnectionOptions
        @Argument var name: String
        @Argument var items: String
        @Option var index: Int?
        func run() async throws {
            let v = try parseJSON(argumentOrStdin(items), what: "items")
            let list = v.arrayValue ?? [v]
            try await ConcordCLI.run {
                out(String(try await connection.connect().collectionInsert(name, items: list, at: index)))
            }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove --count items at --index, or every occurrence of --ids.")
        @OptionGroup var connection: ConnectionOptions
        @Argument var name: String
        @Option var index: Int?
        @Option var count: Int = 1
        @Option(help: "Comma-separated identities.") var ids: String?
        func validate() throws {
            if (index == nil) == (ids == nil) { throw ValidationError("give exactly one of --index, --ids") }
        }
        func run() async throws {
            try await ConcordCLI.run {
                let c = try await connection.connect()
                if let index { out(String(try await c.collectionRemove(name, at: index, count: count))) }
                if let ids {
                    out(String(try await c.collectionRemove(name, ids: ids.split(separator: ",").map(String.init))))
                }
            }
        }
    }

    struct Drop: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "delete", abstract: "Drop the collection.")
        @OptionGroup var connection: ConnectionOptions
        @Argument var name: String
        func run() async throws {
            try await ConcordCLI.run {
                out(String(try await connection.connect().collectionDelete(name)))
            }
        }
    }
}

struct Subscribe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print each event as one JSON line until interrupted (or --count events).")
    @OptionGroup var connection: ConnectionOptions
    @Option var key: String?
    @Option var collection: String?
    @Option(help: "Comma-separated identities.") var ids: String?
    @Flag(help: "Every entity change.") var feed = false
    @Option(help: "With --feed: comma-separated types.") var types: String?
    @Option(help: "A private model tree (JSON).") var model: String?
    @Option(help: "A live query (JSON, as for get --query): prints query events with their changes and count.") var query: String?
    @Option(help: "Stop after this many events.") var count: Int?
    @Flag(help: "Print the subscribe answer (initial state) first.") var initial = false
    @Option(help: "Resume: the seq of the state you hold; an unchanged view answers unchanged, a feed replays what changed after it.")
    var since: Int?
    @OptionGroup var wait: WaitOptions

    func validate() throws {
        let n = [key != nil, collection != nil, ids != nil, feed, model != nil, query != nil].filter { $0 }.count
        if n != 1 { throw ValidationError("give exactly one of --key, --collection, --ids, --feed, --model, --query") }
        if let count, count < 1 { throw ValidationError("--count must be at least 1") }
    }

    func run() async throws {
        let target: SubscriptionTarget
        if let key { target = .key(key) }
        else if let collection { target = .collection(collection) }
        else if let ids { target = .ids(ids.split(separator: ",").map(String.init)) }
        else if feed { target = .feed(types: types.map { $0.split(separator: ",").map(String.init) }) }
        else if let model { target = .model(try parseJSON(model, what: "--model")) }
        else { target = .query(try Self.query(try parseJSON(query!, what: "--query"))) }
        try await ConcordCLI.run {
            let c = try await connection.connect()
            let sub = try await c.subscribe(target, keepEveryEvent: true, since: since, minSeq: wait.minSeq, timeoutMs: wait.timeoutMs)
            if initial {
                var o: JSON = sub.unchanged ? ["seq": .int(sub.seq), "unchanged": true] : ["seq": .int(sub.seq), "initial": sub.initial]
                if let count = sub.count { o = ["seq": .int(sub.seq), "initial": sub.initial, "count": .int(count)] }
                out(o.compactString)
            }
            var printed = 0
            for await event in sub.events {
                for line in Self.lines(event, sub: sub.name) {
                    out(line)
                    printed += 1
                    if let count, printed >= count { return }
                }
            }
        }
    }

    /// The SDK's query from its wire form (the server checks it in full).
    static func query(_ j: JSON) throws -> ConcordQuery {
        guard let type = j["type"]?.stringValue else { throw ValidationError("--query needs \"type\": a non-empty string") }
        // Passed through as JSON: the builder's cases mirror the wire, so keep the text as given.
        return ConcordQuery(raw: j, type: type)
    }

    static func lines(_ e: ConcordEvent, sub: String) -> [String] {
        func obj(_ members: [(String, JSON?)]) -> String {
            var o = JSONObject()
            for (k, v) in members { if let v { o[k] = v } }
            return JSON.object(o).compactString
        }
        switch e {
        case .update(let seq, let model, let changed, let deleted, let context):
            return [obj([("event", "update"), ("sub", .string(sub)), ("seq", .int(seq)), ("model", model ?? .null),
                         ("changed", .array(changed.map { .string($0) })), ("deleted", .array(deleted.map { .string($0) })),
                         ("context", context)])]
        case .entities(let seq, let list, let context):
            return list.map { obj([("event", "entity"), ("sub", .string(sub)), ("seq", .int(seq)), ("id", .string($0.id)),
                                   ("model", $0.model ?? .null), ("context", context)]) }
        case .collection(let seq, let edits, let context):
            let changes: [JSON] = edits.map(\.json)
            return [obj([("event", "collection"), ("sub", .string(sub)), ("seq", .int(seq)), ("changes", .array(changes)),
                         ("context", context)])]
        case .query(let seq, let edits, let count, let context):
            return [obj([("event", "query"), ("sub", .string(sub)), ("seq", .int(seq)), ("changes", .array(edits.map(\.json))),
                         ("count", .int(count)), ("context", context)])]
        case .ended(let seq, let context):
            return [obj([("event", "delete"), ("sub", .string(sub)), ("seq", .int(seq)), ("context", context)])]
        case .failed(let seq, let error):
            var e = JSONObject()
            e["code"] = .string(error.code.rawValue)
            e["message"] = .string(error.message)
            return [obj([("event", "delete"), ("sub", .string(sub)), ("seq", .int(seq)), ("error", .object(e))])]
        case .truncated(let seq):
            return [obj([("event", "truncated"), ("sub", .string(sub)), ("seq", .int(seq))])]
        case .resynced(let seq, let state):
            return [obj([("event", "resynced"), ("sub", .string(sub)), ("seq", .int(seq)), ("state", state)])]
        }
    }
}

struct Stats: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print server figures as a table (--json for the raw object, --prometheus for metrics, --watch to follow).")
    @OptionGroup var connection: ConnectionOptions
    @Flag(help: "Print the raw JSON object.") var json = false
    @Flag(help: "Print the metrics in Prometheus's text format (what --metrics serves over HTTP).") var prometheus = false
    @Flag(help: "Print one compact line of figures and rates every --interval seconds until interrupted.") var watch = false
    @Option(help: "Seconds between lines with --watch.") var interval: Double = 1
    @Option(help: "With --watch: stop after this many lines.") var count: Int?

    func validate() throws {
        if [json, prometheus, watch].filter({ $0 }).count > 1 { throw ValidationError("--json, --prometheus and --watch exclude each other") }
        if !(interval > 0) { throw ValidationError("--interval must be positive") }
        if let count, count < 1 { throw ValidationError("--count must be at least 1") }
    }

    func run() async throws {
        try await ConcordCLI.run {
            let client = try await connection.connect()
            if prometheus {
                FileHandle.standardOutput.write(Data(try await client.prometheusMetrics().utf8))
                return
            }
            if watch { return try await Self.watch(client, interval: interval, count: count) }
            let s = try await client.stats()
            if json {
                out(JSON.object(s).compactString)
                return
            }
            var rows: [(String, String)] = []
            func walk(_ prefix: String, _ v: JSON) {
                if case .object(let o) = v {
                    for m in o.members { walk(prefix.isEmpty ? m.key : "\(prefix).\(m.key)", m.value) }
                } else {
                    rows.append((prefix, v.stringValue ?? v.compactString))
                }
            }
            walk("", .object(s))
            let width = rows.map { $0.0.count }.max() ?? 0
            for (k, v) in rows { out(k.padding(toLength: width, withPad: " ", startingAt: 0) + "  " + v) }
        }
    }

    /// vmstat-style: a header, then one line per interval with the gauges
    /// and the rates since the previous line.
    static func watch(_ client: ConcordClient, interval: Double, count: Int?) async throws {
        let columns = ["time", "conns", "subs", "entities", "docs", "mut/s", "req/s", "events/s", "coalescing", "alloc_MB", "backlog"]
        let widths = [8, 6, 9, 9, 8, 8, 8, 9, 10, 9, 8]
        func line(_ cells: [String]) -> String {
            cells.indices.map { i in
                let c = cells[i]
                return c.count >= widths[i] ? c : String(repeating: " ", count: widths[i] - c.count) + c
            }.joined(separator: " ")
        }
        out(line(columns))
        func int(_ o: JSONObject, _ path: String...) -> Int {
            var v: JSON? = .object(o)
            for p in path { v = v?[p] }
            return v?.numberValue?.intValue ?? 0
        }
        let clockFormat = DateFormatter()
        clockFormat.dateFormat = "HH:mm:ss"
        var previous: (seq: Int, requests: Int, events: Int, at: Date)?
        var printed = 0
        while true {
            let s = try await client.stats()
            let now = Date()
            let seq = int(s, "seq"), requests = int(s, "requests"), events = int(s, "events")
            var rates = ["-", "-", "-"]
            if let p = previous {
                let dt = max(now.timeIntervalSince(p.at), 0.001)
                rates = [seq - p.seq, requests - p.requests, events - p.events].map { String(Int((Double($0) / dt).rounded())) }
            }
            previous = (seq, requests, events, now)
            out(line([clockFormat.string(from: now), String(int(s, "connections")), String(int(s, "subscriptions")),
                      String(int(s, "entities")), String(int(s, "documents"))] + rates
                     + [String(int(s, "coalescing")), String(int(s, "memory", "allocated") >> 20), String(int(s, "cache", "backlog"))]))
            printed += 1
            if let count, printed >= count { return }
            try await Task.sleep(nanoseconds: UInt64(interval * 1e9))
        }
    }
}

struct Clients: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the server's connections: who, how old, how busy, how far behind (--json for the raw list).")
    @OptionGroup var connection: ConnectionOptions
    @Flag(help: "Print the raw JSON list.") var json = false

    func run() async throws {
        try await ConcordCLI.run {
            let list = try await connection.connect().stats(clients: true)["clients"]?.arrayValue ?? []
            if json {
                out(JSON.array(list).compactString)
                return
            }
            let columns = ["id", "name", "pid", "uid", "age_ms", "subscriptions", "requests", "unsent_bytes", "unprocessed_bytes", "coalescing", "waiting"]
            var rows = [columns]
            for c in list {
                rows.append(columns.map { k in
                    guard let v = c[k], v != .null else { return "-" }
                    return v.stringValue ?? v.compactString
                })
            }
            let widths = columns.indices.map { i in rows.map { $0[i].count }.max() ?? 0 }
            for r in rows {
                out(r.indices.map { r[$0].padding(toLength: widths[$0], withPad: " ", startingAt: 0) }.joined(separator: "  "))
            }
        }
    }
}

struct Schema: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the schema; --required '{\"Type\":[\"member\"]}' changes it first.")
    @OptionGroup var connection: ConnectionOptions
    @Option(help: "Required members per type (JSON object).") var required: String?

    func run() async throws {
        var lists: [String: [String]]?
        if let required {
            guard let o = try parseJSON(required, what: "--required").objectValue else { throw ValidationError("--required must be an object") }
            var l: [String: [String]] = [:]
            for m in o.members { l[m.key] = m.value.arrayValue?.compactMap { $0.stringValue } ?? [] }
            lists = l
        }
        try await ConcordCLI.run {
            let schema = try await connection.connect().schema(lists)
            var o = JSONObject()
            for (k, v) in schema.sorted(by: { $0.key < $1.key }) { o[k] = .array(v.map { .string($0) }) }
            out(JSON.object(o).compactString)
        }
    }
}
