// swift-tools-version:6.1
// Micro-benchmarks of the consistency core (no sockets, no threads):
// parse, apply, render, encode, subscribe, with malloc counts per operation,
// so a regression in allocations shows up as a number. A separate package so
// ordo-one/benchmark never reaches users of the root package.
//
//   cd Benchmarks/CoreBench && swift package --disable-sandbox benchmark
//   (or `make bench-core` from the root)
import PackageDescription

let package = Package(
    name: "CoreBench",
    dependencies: [
        .package(path: "../.."),
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        .executableTarget(
            name: "Core",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "_ConcordCore", package: "main"),
                .product(name: "ConcordJSON", package: "main"),
            ],
            path: "Benchmarks/Core",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
    ]
)
