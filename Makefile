# Entry points. `make demo` and `make test` are the README's Quick start.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 30
CMAKE_COMMON = -G Ninja -DNPURT_WERROR=ON

.PHONY: deps build demo test test-release test-asan fuzz bench bench-ops clean model

deps:
	@bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/npurt demo

test-release: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNPURT_SANITIZE=ON -DNPURT_BENCH=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)

fuzz: deps
	CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNPURT_FUZZ=ON -DNPURT_BENCH=OFF >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_verifier fuzz_gguf
	mkdir -p $(FUZZ_BUILD)/corpus/verifier $(FUZZ_BUILD)/corpus/gguf
	./$(FUZZ_BUILD)/fuzz/fuzz_verifier -max_total_time=$(FUZZ_SECONDS) -seed=1 $(FUZZ_BUILD)/corpus/verifier fuzz/seeds/verifier
	./$(FUZZ_BUILD)/fuzz/fuzz_gguf -max_total_time=$(FUZZ_SECONDS) -seed=1 $(FUZZ_BUILD)/corpus/gguf fuzz/seeds/gguf

test: test-release test-asan fuzz

bench: build bench-ops
	./$(BUILD)/bench/npurt_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

# Operator throughput and latency against OpenBLAS and a STREAM-style read: a table on
# stdout and the same figures as JSON in $(BUILD)/ops_bench.json.
bench-ops: build
	./$(BUILD)/bench/npurt_ops_bench --benchmark_out=$(BUILD)/ops_bench.json --benchmark_out_format=json

# The Gemma-3-270M Q4_K_M GGUF at models/gemma-3-270m-q4_k_m.gguf; not needed by build or test.
model:
	@bash scripts/install-model.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
