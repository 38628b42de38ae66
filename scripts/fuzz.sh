#!/usr/bin/env bash
# Builds the libFuzzer targets in Tests/Fuzz (swiftc -sanitize=fuzzer,address)
# and runs each for FUZZ_SECONDS (default 60) from its seed corpus.
#   scripts/fuzz.sh [target ...]     targets: json framer request engine (default: all)
# A crash, a failed check or a sanitizer report stops the run with exit 1;
# the input that failed is left in .build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.build-fuzz
SECONDS_EACH=${FUZZ_SECONDS:-60}
# A failed check is a Swift fatalError: let libFuzzer see the signal at once
# (the runtime's interactive backtracer would hold the process).
export SWIFT_BACKTRACE=enable=no
mkdir -p "$OUT/artifacts"
FLAGS=(-sanitize=fuzzer,address -parse-as-library -O -g -I "$OUT" -L "$OUT" -I Sources/CConcordPrefetch/include)

# The linker warns once per ASan helper it cannot export; nothing to act on.
quiet() { "$@" 2>&1 | { grep -v "Cannot export local symbol" || true; }; }

module() {  # name, sources...
    local name=$1; shift
    quiet swiftc "${FLAGS[@]}" -emit-library -static -emit-module -module-name "$name" \
        -emit-module-path "$OUT/$name.swiftmodule" -o "$OUT/lib$name.a" "$@"
}

echo "building the project's modules with coverage and ASan"
module ConcordJSON Sources/ConcordJSON/*.swift
module ConcordProtocol Sources/ConcordProtocol/*.swift
module ConcordCore Sources/ConcordCore/*.swift
module ConcordTestSupport Tests/ConcordTestSupport/*.swift

declare -A SRC=([json]=FuzzJSON [framer]=FuzzFramer [request]=FuzzRequest [engine]=FuzzEngine)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(json framer request engine)
for t in "${targets[@]}"; do
    src=${SRC[$t]:?unknown target $t (json framer request engine)}
    quiet swiftc "${FLAGS[@]}" -module-name "Fuzz_$t" "Tests/Fuzz/$src.swift" \
        -lConcordTestSupport -lConcordCore -lConcordProtocol -lConcordJSON -o "$OUT/fuzz-$t"
done
for t in "${targets[@]}"; do
    corpus="$OUT/corpus/$t"
    mkdir -p "$corpus"
    echo "fuzzing $t for ${SECONDS_EACH}s (corpus $corpus, seeds Tests/Fuzz/seeds/$t)"
    "$OUT/fuzz-$t" -max_total_time="$SECONDS_EACH" -print_final_stats=1 -max_len=4096 -timeout=20 \
        -artifact_prefix="$OUT/artifacts/$t-" "$corpus" "Tests/Fuzz/seeds/$t" 2>&1 | tail -n 12
    test "${PIPESTATUS[0]}" -eq 0 || { echo "fuzz target $t failed; see $OUT/artifacts/"; exit 1; }
done
