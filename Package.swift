// swift-tools-version:6.2
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

/// The hot modules (codec, core, and the server's loop and sequencer) skip
/// the run-time exclusivity checks in release builds: they cost ~80
/// instructions per access to a class's stored property (200 per delivered
/// event, and ~45 accesses per request on the server's hand-off path between
/// the loop and the sequencer, measured with callgrind). Debug
/// builds, which run the tests, keep them. An unsafe flag: SwiftPM accepts it
/// in a package depended on by version from swift-tools-version 6.2 on, which
/// is why this manifest asks for 6.2 (Tests/ConcordPackagingTests checks that
/// an outside package builds against a tagged clone).
let hotPathSettings: [SwiftSetting] = swiftSettings + [
    .unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release)),
]

let package = Package(
    name: "concord",
    products: [
        .executable(name: "concord-server", targets: ["ConcordServerMain"]),
        .library(name: "ConcordJSON", targets: ["ConcordJSON"]),
        .library(name: "ConcordProtocol", targets: ["ConcordProtocol"]),
        .library(name: "_ConcordCore", targets: ["ConcordCore"]),
        .library(name: "ConcordClient", targets: ["ConcordClient"]),
        .library(name: "ConcordSocket", targets: ["ConcordSocket"]),
        // For SDK users' tests: a real concord-server on a temporary socket.
        .library(name: "ConcordTestServer", targets: ["ConcordTestServer"]),
        .executable(name: "concord", targets: ["ConcordCLI"]),
        // Cache backends, loaded at run time through the C ABI (docs/PLUGINS.md).
        .library(name: "ConcordMemoryBackend", type: .dynamic, targets: ["ConcordMemoryBackend"]),
        .library(name: "ConcordSQLiteBackend", type: .dynamic, targets: ["ConcordSQLiteBackend"]),
        .library(name: "ConcordHashBackend", type: .dynamic, targets: ["ConcordHashBackend"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        // `make docs`: the SDK's DocC documentation (a command plugin; nothing of it is linked).
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // System libraries (Debian packages; `make` installs them).
        .systemLibrary(name: "CLibUV", pkgConfig: "libuv", providers: [.apt(["libuv1-dev"])]),
        .systemLibrary(name: "CJemalloc", pkgConfig: "jemalloc", providers: [.apt(["libjemalloc-dev"])]),
        .target(name: "CConcordRuntime"),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        // Cluster mode's log client (hiredis and its libuv adapter, PROTOCOL §8).
        .systemLibrary(name: "CHiredis", providers: [.apt(["libhiredis-dev"])]),
        .target(name: "CConcordRedis", dependencies: ["CHiredis", "CLibUV"]),
        // The plugin ABI: one C header (Sources/CConcordBackendABI/include/concord_backend.h).
        .target(name: "CConcordBackendABI"),
        .target(name: "ConcordBackendKit", dependencies: ["CConcordBackendABI", "ConcordJSON"], swiftSettings: swiftSettings),

        // Cache backends: each a .dynamic product under Plugins/.
        .target(name: "ConcordMemoryBackend", dependencies: ["ConcordBackendKit", "CConcordBackendABI", "ConcordJSON"],
                path: "Plugins/ConcordMemoryBackend", swiftSettings: swiftSettings),
        .target(name: "ConcordSQLiteBackend", dependencies: ["ConcordBackendKit", "CConcordBackendABI", "CSQLite", "ConcordJSON"],
                path: "Plugins/ConcordSQLiteBackend", swiftSettings: swiftSettings),
        .target(name: "ConcordHashBackend", dependencies: ["CConcordBackendABI"], path: "Plugins/ConcordHashBackend"),

        // Pure Swift layers: no libuv, no sockets, no Foundation.
        .target(name: "ConcordJSON", swiftSettings: hotPathSettings),
        .target(name: "ConcordProtocol", dependencies: ["ConcordJSON"], swiftSettings: swiftSettings),
        // A cache-line prefetch for the store's loops over scattered records (one static inline C function).
        .target(name: "CConcordPrefetch"),
        .target(name: "ConcordCore", dependencies: ["ConcordJSON", "ConcordProtocol", "CConcordPrefetch"], swiftSettings: hotPathSettings),

        // Connecting to a Unix socket: the one helper every client in the tree uses (Glibc only).
        .target(name: "ConcordSocket", swiftSettings: swiftSettings),

        .target(name: "ConcordTestServer", dependencies: ["ConcordSocket"], swiftSettings: swiftSettings),

        // The client SDK: a POSIX socket, a reader thread, async API; no libuv.
        .target(name: "ConcordClient", dependencies: ["ConcordJSON", "ConcordProtocol", "ConcordSocket"], swiftSettings: swiftSettings),
        .executableTarget(
            name: "ConcordCLI",
            dependencies: ["ConcordClient", "ConcordJSON", .product(name: "ArgumentParser", package: "swift-argument-parser")],
            swiftSettings: swiftSettings
        ),

        // The server: libuv loop, sequencer and worker threads, jemalloc.
        .target(
            name: "ConcordServer",
            dependencies: [
                "CLibUV", "CJemalloc", "CConcordRuntime", "CConcordBackendABI", "CHiredis", "CConcordRedis", "ConcordJSON", "ConcordProtocol", "ConcordCore", "ConcordSocket",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: hotPathSettings
        ),
        .executableTarget(
            name: "ConcordServerMain",
            dependencies: [
                "ConcordServer", "ConcordCore", "ConcordJSON",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),

        // Ad-hoc load and measurement tool.
        .executableTarget(
            name: "concord-load",
            dependencies: [
                "CJemalloc", "ConcordJSON", "ConcordProtocol", "ConcordCore", "ConcordServer", "ConcordSocket",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Benchmarks/ConcordLoad", swiftSettings: swiftSettings
        ),

        // Helpers shared by the test targets (not a product).
        .target(name: "ConcordTestSupport", dependencies: ["ConcordJSON"], path: "Tests/ConcordTestSupport", swiftSettings: swiftSettings),

        .testTarget(name: "ConcordJSONTests", dependencies: ["ConcordJSON"], swiftSettings: swiftSettings),
        .testTarget(name: "ConcordProtocolTests", dependencies: ["ConcordProtocol", "ConcordJSON", "ConcordTestSupport"], swiftSettings: swiftSettings),
        .testTarget(name: "ConcordCoreTests", dependencies: ["ConcordCore", "ConcordProtocol", "ConcordJSON", "ConcordTestSupport"], swiftSettings: swiftSettings),
        .testTarget(
            name: "ConcordBackendTests",
            dependencies: [
                "ConcordServer", "ConcordJSON", "ConcordTestSupport", .product(name: "Logging", package: "swift-log"),
                // LatencyHistogramTests compares the server's histogram text with swift-prometheus's.
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
        // The README's SDK snippet, compiled and run (a snippet that stops compiling fails CI).
        .testTarget(name: "ConcordReadmeTests", dependencies: ["ConcordClient", "ConcordTestServer"], swiftSettings: swiftSettings),
        .testTarget(
            name: "ConcordIntegrationTests",
            dependencies: ["ConcordJSON", "ConcordClient", "ConcordSocket", "ConcordTestServer", "ConcordTestSupport"],
            swiftSettings: swiftSettings
        ),
    ]
)
