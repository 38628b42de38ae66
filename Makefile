# Concord: `make run` starts the server, `make test` runs the whole suite.
SHELL := /bin/bash
APT_PACKAGES := libuv1-dev libjemalloc-dev libsqlite3-dev libhiredis-dev redis-server pkg-config gcc
# Empty: the server's default, a private per-user directory (README, "concord-server").
SOCKET ?= $(CONCORD_SOCKET)
SWIFT_TEST_FLAGS ?=

.PHONY: docs run test build release deps clean soak bench bench-full bench-deps bench-core bench-instructions profile-update callgrind-deps sanitize sanitize-thread sanitize-address fuzz

# Installs the Debian packages the build needs when one is missing.
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get install -y $$missing || { $$SUDO apt-get update && $$SUDO apt-get install -y $$missing; }; \
	fi

build: deps
	swift build

release: deps
	swift build -c release

run: release
	.build/release/concord-server $(if $(SOCKET),--socket $(SOCKET),)

# Builds everything (the server binary is what the integration tests spawn),
# runs every test, then builds an outside package that depends on a clone of
# this repository by version tag and runs the README's snippet from there,
# and builds the load-test benchmark (its own package: `make bench` must not
# be the first to find it broken).
test: deps
	swift build
	swift test $(SWIFT_TEST_FLAGS)
	scripts/outside-package-test.sh
	cd Benchmarks/ConcordBench && swift build

# Longer randomized runs (see README, "Soak").
soak: deps
	swift build
	CONCORD_SOAK=1 swift test --filter 'Stress|Robustness|killingHostsUnderLoad|everyAnswerAHostGives'

# The whole suite under ThreadSanitizer, then AddressSanitizer (README, "Sanitizers").
# Workarounds built in: the executables export the sanitizer runtime's symbols
# so plugins built with it load (scripts/sanitizer-exports.list); the
# sanitizer's C++ runtime is linked (jemalloc's C++ operators); jemalloc's
# background thread is off (it crashes under TSan). A report from any process
# (the test runner, every spawned server) fails the run. SOAK=1 adds make soak.
SANITIZER_FLAGS = -Xlinker --dynamic-list=$(CURDIR)/scripts/sanitizer-exports.list -Xswiftc -Xclang-linker -Xswiftc -fsanitize-link-c++-runtime
sanitize: sanitize-thread sanitize-address

sanitize-thread sanitize-address: sanitize-%: deps
	rm -rf .build-$*san/reports && mkdir -p .build-$*san/reports
	swift build --build-tests --sanitize=$* --scratch-path .build-$*san $(SANITIZER_FLAGS)
	$(if $(SOAK),CONCORD_SOAK=1,) CONCORD_SANITIZER=$* MALLOC_CONF=background_thread:false SWIFT_BACKTRACE=enable=no \
	TSAN_OPTIONS="log_path=$(CURDIR)/.build-$*san/reports/report" ASAN_OPTIONS="log_path=$(CURDIR)/.build-$*san/reports/report:detect_leaks=1" LSAN_OPTIONS="suppressions=$(CURDIR)/scripts/lsan.supp:print_suppressions=0" \
	swift test --sanitize=$* --scratch-path .build-$*san $(SANITIZER_FLAGS) $(if $(SOAK),--filter 'Stress|Robustness',) $(SWIFT_TEST_FLAGS)
	@if ls .build-$*san/reports/report.* >/dev/null 2>&1; then \
		echo "$* sanitizer reports:"; cat .build-$*san/reports/report.*; exit 1; \
	else echo "$* sanitizer: no reports"; fi

# libFuzzer targets (Tests/Fuzz), FUZZ_SECONDS each (default 60); FUZZ_TARGETS to pick.
fuzz:
	scripts/fuzz.sh $(FUZZ_TARGETS)

# Benchmarks: Concord next to Redis pub/sub (Benchmarks/ConcordBench, its own package).
bench-deps: deps
	@dpkg -s redis-server >/dev/null 2>&1 || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get install -y redis-server || { $$SUDO apt-get update && $$SUDO apt-get install -y redis-server; }; }
	swift build -c release
	cd Benchmarks/ConcordBench && swift build -c release

# Quick run (under 3 minutes): writes Benchmarks/results/latest.json and chart.svg.
bench: bench-deps
	cd Benchmarks/ConcordBench && .build/release/concord-bench --server ../../.build/release/concord-server --out ../results

# Longer runs, 1M-subscription memory scenario included.
bench-full: bench-deps
	cd Benchmarks/ConcordBench && .build/release/concord-bench --full --server ../../.build/release/concord-server --out ../results

# Micro-benchmarks of the core (wall clock and mallocs per operation; first build ~3 min).
bench-core: deps
	cd Benchmarks/CoreBench && swift package --disable-sandbox benchmark --no-progress

# Instructions per update in the engine (callgrind; repeatable on a noisy machine).
# valgrind 3.19 cannot read Swift 6.3's DWARF 5, so it runs a copy without
# debug info; a row that measured nothing fails the target. First the whole
# server process next to the whole redis-server (1 / 10 / 100 subscribers),
# then the engine alone.
bench-instructions: release callgrind-deps
	python3 scripts/instructions-vs-redis.py .build/release/concord-server /usr/bin/redis-server
	objcopy --strip-debug .build/release/concord-load .build/release/concord-load.nodebug
	@for k in "none 1 20000" "key 1 20000" "key 100 2000"; do set -- $$k; \
		valgrind --tool=callgrind --callgrind-out-file=.build/callgrind.$$1.$$2 .build/release/concord-load.nodebug core --kind $$1 --subs $$2 -n $$3 >/dev/null 2>.build/callgrind.$$1.$$2.log \
			|| { echo "valgrind failed on $$1 x $$2:"; tail -5 .build/callgrind.$$1.$$2.log; exit 1; }; \
		callgrind_annotate --inclusive=yes .build/callgrind.$$1.$$2 | grep -E "Engine(C10handleLine_4from|C10takeOutputSay)" \
		| awk -v n=$$3 -v k="$$1 x $$2" '{gsub(",","",$$1); s+=$$1} END { if (s == 0) { printf "%s: measured nothing (no Engine.handleLine in the profile)\n", k; exit 1 } printf "%s: %.0f instructions per update (Engine.handleLine + takeOutput, inclusive, setup lines included)\n", k, s/n }' || exit 1; done

# valgrind (callgrind) and redis-server, for the instruction counts.
callgrind-deps:
	@missing=""; for p in valgrind redis-server; do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get install -y $$missing || { $$SUDO apt-get update && $$SUDO apt-get install -y $$missing; }; \
	fi

# Where one update's instructions go (whole server, callgrind): the path by
# phase and the highest self costs. PROFILE_ARGS: e.g. --subs 10,
# --callers swift_retain, --callees "Store.apply(", --keep DIR.
profile-update: release callgrind-deps
	python3 scripts/profile-update.py .build/release/concord-server $(PROFILE_ARGS)

# The SDK's documentation (DocC catalog Sources/ConcordClient/ConcordClient.docc), as a static site.
docs: deps
	mkdir -p .build/docs
	swift package --allow-writing-to-directory .build/docs generate-documentation --target ConcordClient \
		--disable-indexing --transform-for-static-hosting --output-path .build/docs/ConcordClient
	@echo "open .build/docs/ConcordClient/index.html (or serve the folder)"

clean:
	rm -rf .build Benchmarks/ConcordBench/.build Benchmarks/CoreBench/.build
