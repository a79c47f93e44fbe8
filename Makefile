# A thin front for CMake. `make run` builds and starts the server; `make test` builds and runs the tests.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
MODEL ?= models/stories260K-q8_0.gguf
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=

.PHONY: all deps build run test asan fuzz format clean

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

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHR_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

FUZZ_SECONDS ?= 60
fuzz: deps
	@HR_DEPS_EXTRA="clang libclang-rt-dev" scripts/deps.sh
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DHR_FUZZ=ON -DHR_SANITIZE=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_gguf
	@mkdir -p build-fuzz/corpus-gguf
	build-fuzz/fuzz_gguf -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus-gguf

format:
	@clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) build-asan build-fuzz
