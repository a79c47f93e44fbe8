# A thin front for CMake. `make run` builds and starts the server; `make test` builds and runs the tests.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
MODEL ?= models/stories260K-q8_0.gguf
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=

.PHONY: all deps build run test asan tsan fuzz faults soak format clean

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The main job: the OpenAI-compatible server, on the demo model shipped in models/ unless MODEL= names
# another GGUF. It prints its URL and a curl line to try; Ctrl-C drains and exits.
run: build
	$(BUILD)/headroom serve -m $(MODEL) --host $(HOST) --port $(PORT) $(ARGS)

# The tests also use a few tools (the terminal view under tmux, the dashboard in chromium, the shared KV
# tier against redis-server, the replicas behind haproxy, the Kubernetes example through yamllint, /metrics
# through promtool and a Prometheus server).
# clang-19 compiles the CUDA kernels (docs/GPU.md): installed before the build, so that the build
# embeds them and a kernel that does not compile fails here.
TEST_TOOLS ?= tmux curl redis-server haproxy yamllint chromium prometheus clang-19
test:
	@HR_DEPS_OPTIONAL=1 HR_DEPS_EXTRA="$(TEST_TOOLS)" scripts/deps.sh
	@$(MAKE) --no-print-directory build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHR_SANITIZE=ON -DHR_FAULT=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# ThreadSanitizer over the tests that run threads (engine thread, thread pool, HTTP server, soak). Only
# those are built. Suppressions, each with its reason, are in tests/tsan.supp.
TSAN_TESTS ?= test_threadpool test_engine test_engine_prefix test_engine_policy test_policy_stream test_runtime \
	test_server test_server_hostile_req test_model test_kv_policy_model test_soak
tsan: deps
	@cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS=-O1 -DHR_TSAN=ON >/dev/null
	@cmake --build build-tsan -j $(JOBS) $(addprefix --target ,$(TSAN_TESTS))
	@cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1" \
		ctest --output-on-failure -j $(JOBS) -R '^($(subst $(eval) ,|,$(strip $(TSAN_TESTS))))$$'

# Fault injection (src/common/fault.h): the ASan build above is also the fault build, so `make asan`
# runs tests/test_faults.c with the rest; this runs it alone, printing what it walked.
faults: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHR_SANITIZE=ON -DHR_FAULT=ON >/dev/null
	@cmake --build build-asan -j $(JOBS) --target test_faults
	@ASAN_OPTIONS=detect_leaks=1 build-asan/test_faults

# The soak (tests/test_soak.c): SOAK_ROUNDS rounds per client (make test runs 30; bench/soak.sh more).
SOAK_ROUNDS ?= 30
soak: build
	@HR_SOAK_ROUNDS=$(SOAK_ROUNDS) $(BUILD)/test_soak

# libFuzzer: each target runs FUZZ_SECONDS from its committed seeds (fuzz/corpus/<name>/; what it
# finds goes to build-fuzz/corpus-<name>/). Any crash, leak or timeout fails, leaving
# build-fuzz/crash-<name>-* to replay with build-fuzz/fuzz_<name> FILE.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= gguf http tokenizer chat jinja grammar trace safetensors
fuzz: deps
	@HR_DEPS_EXTRA="clang libclang-rt-dev" scripts/deps.sh
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DHR_FUZZ=ON -DHR_SANITIZE=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS) $(addprefix --target fuzz_,$(FUZZ_TARGETS))
	@set -e; for t in $(FUZZ_TARGETS); do \
		mkdir -p build-fuzz/corpus-$$t; echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
		build-fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=30 -rss_limit_mb=4096 \
			-print_final_stats=1 -artifact_prefix=build-fuzz/crash-$$t- build-fuzz/corpus-$$t fuzz/corpus/$$t \
			2>build-fuzz/fuzz-$$t.log || { tail -40 build-fuzz/fuzz-$$t.log; exit 1; }; \
		grep -E "^stat::number_of_executed_units|^Done" build-fuzz/fuzz-$$t.log || true; \
	done

format:
	@clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
