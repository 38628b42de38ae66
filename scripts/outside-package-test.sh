#!/usr/bin/env bash
# Concord as an app's dependency, the way a user adds it: an outside package
# in a temporary folder depends on a git clone of this repository by URL and
# version tag (not by path), builds, and runs the README's SDK snippet against
# a real server started with ConcordTestServer. Fails if SwiftPM refuses the
# dependency (unsafe flags, a package name, a missing product) or the snippet
# stops working from outside. Run by `make test`.
#
# The clone is of the committed HEAD (what CI sees); uncommitted changes are
# not in it. CONCORD_SERVER_BIN: the server the snippet talks to (default:
# this checkout's debug build).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
server="${CONCORD_SERVER_BIN:-$root/.build/debug/concord-server}"
[ -x "$server" ] || { echo "outside-package test: no server binary at $server (swift build first)" >&2; exit 1; }
work="$(mktemp -d /tmp/concord-outside.XXXXXX)"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

# The release a user would depend on: a clone (under a folder not named after
# the project) whose only tag is 0.1.0.
git clone --quiet --no-hardlinks "$root" "$work/upstream-concord"
git -C "$work/upstream-concord" tag -l | xargs -r git -C "$work/upstream-concord" tag -d >/dev/null
git -C "$work/upstream-concord" tag 0.1.0

# The benchmark packages name the root package by its folder's identity:
# their package graphs must load in a clone whose folder is not "main".
for bench in ConcordBench CoreBench; do
    ( cd "$work/upstream-concord/Benchmarks/$bench" && swift package describe >/dev/null ) \
        || { echo "outside-package test: Benchmarks/$bench does not load in a clone named upstream-concord" >&2; exit 1; }
done

mkdir -p "$work/app/Sources/App"
cat > "$work/app/Package.swift" <<SWIFT
// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "app",
    dependencies: [
        .package(url: "file://$work/upstream-concord", from: "0.1.0"),
    ],
    targets: [
        .executableTarget(name: "App", dependencies: [
            .product(name: "ConcordClient", package: "upstream-concord"),
            .product(name: "ConcordTestServer", package: "upstream-concord"),
        ]),
    ]
)
SWIFT
# The README's snippet, as the README shows it.
sed -n '/README-SNIPPET-BEGIN/,/README-SNIPPET-END/p' "$root/Tests/ConcordReadmeTests/ReadmeSnippet.swift" \
    | grep -v 'README-SNIPPET-' > "$work/app/Sources/App/Snippet.swift"
grep -q 'func senderAfterRename' "$work/app/Sources/App/Snippet.swift" || { echo "outside-package test: README snippet not found" >&2; exit 1; }
# The read-modify-write snippet too (it uses only ConcordClient's names).
sed -n '/README-SNIPPET-2-BEGIN/,/README-SNIPPET-2-END/p' "$root/Tests/ConcordReadmeTests/ReadmeSnippet.swift" \
    | grep -v 'README-SNIPPET-' > "$work/app/Sources/App/Snippet2.swift"
sed -i '1i import ConcordClient' "$work/app/Sources/App/Snippet2.swift"
cat > "$work/app/Sources/App/main.swift" <<'SWIFT'
import ConcordClient
import ConcordTestServer

// In a function, not at the top level: a global is never released, and the
// server's temporary directory goes when the object does.
func run() async throws -> (name: String?, n: Int, status: Int32) {
    let server = try ConcordTestServer()
    let name = try await senderAfterRename(socket: server.socketPath)
    let client = try await ConcordClient.connect(socketPath: server.socketPath)
    _ = try await increment(client, 1)
    let n = try await increment(client, 1)
    client.close()
    return (name, n, server.stop())
}
let (name, n, status) = try await run()
guard name == "Ann B.", n == 2, status == 0 else {
    print("outside-package test: expected \"Ann B.\", 2 and exit 0, got \(name ?? "nil"), \(n) and \(status)")
    exit(1)
}
print("outside-package test: the README snippet ran against ConcordClient 0.1.0 by version")
SWIFT
# An exit() needs Glibc in main.swift; keep the app honest about its imports.
sed -i '1i #if canImport(Glibc)\nimport Glibc\n#endif' "$work/app/Sources/App/main.swift"

( cd "$work/app" && swift build 2>&1 | tail -5 ) || true
[ -x "$work/app/.build/debug/App" ] || { echo "outside-package test: the app did not build against Concord 0.1.0" >&2; exit 1; }
CONCORD_SERVER_BIN="$server" "$work/app/.build/debug/App"
echo "outside-package test: $(( $(date +%s) - start )) s"
