# Entry points. `make demo` and `make test` are the README's Quick start.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 30
# libFuzzer targets, fuzz/fuzz_<name>.cc with seeds in fuzz/seeds/<name>/; each runs
# FUZZ_SECONDS, JOBS of them at a time (each is one thread).
FUZZ_TARGETS = verifier assembler gguf tokenizer sequence openai_request chat_template
MODEL = models/gemma-3-270m-q4_k_m.gguf
CMAKE_COMMON = -G Ninja -DNPURT_WERROR=ON
# The compiler cache keys on paths relative to the checkout, so a fresh clone elsewhere
# reuses the objects of an earlier one. Builds with debug info (the sanitizer and fuzz
# builds) name the checkout as "." in it: otherwise ccache keys them on the build
# directory's absolute path, and every clone rebuilds them from scratch.
export CCACHE_BASEDIR ?= $(CURDIR)
DEBUG_PATHS = -fdebug-prefix-map=$(CURDIR)=.
# Sanitizer builds at -O1 with line tables only: a third of -O2 -g's compile time, and
# reports still name file and line.
ASAN_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG $(DEBUG_PATHS)"

.PHONY: deps build demo generate bench-model bench-peer bench-serve bench-resident test test-release test-asan test-tsan test-python test-install test-docs fuzz bench bench-ops bench-comm bench-parallel clean model

deps:
	@bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/npurt demo

# The main job: Gemma-3-270M greedy decoding on the simulated NPU.
PROMPT ?= The capital of France is
generate: build model
	./$(BUILD)/npurt generate --model $(MODEL) --prompt "$(PROMPT)"

# The Release suite runs the real-model tests too (the model is installed first); the
# sanitizer suite runs the synthetic ones only, the real ones being minutes there.
test-release: build model
	cd $(BUILD) && NPURT_MODEL=$(CURDIR)/$(MODEL) ctest --output-on-failure -j $(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) $(CMAKE_COMMON) $(ASAN_FLAGS) -DNPURT_SANITIZE=ON -DNPURT_BENCH=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && env -u NPURT_MODEL ctest --output-on-failure -j $(JOBS)

# ThreadSanitizer over every C++ test that does not start mpirun (label mpi): the
# simulated device runs a thread per stream and a pool for its cores, the write
# tracker a fault handler, the worker a progress thread, the CLI's soak all of them
# under faults. A race or lock-order inversion fails its test at the first report
# (halt_on_error); second_deadlock_stack shows where each of the two locks was taken.
# Excluded by name, because they race on purpose: OrderingWithoutWaits.* (hazards run
# with ordering off, to show they go wrong), CollectiveOrdering.SkippingTheStreamOrderIsCaught
# (a collective that reads its input while the stream before it still writes it, to
# show the result goes wrong) and TsanControl.* (the negative control;
# tsan.race_control_is_reported checks that it is reported and fails). TSan's own
# SIGSEGV handling stays on (no handle_segv=0): its sigaction interceptor hands the
# write faults of tracked mode to the tracker's handler. Like the ASan suite, the
# real-model tests are left out (NPURT_MODEL unset), and so is serve.chat_templates
# (one thread rendering a few thousand templates against jinja2: the ASan suite runs it).
# NPURT_SANITIZE=OFF: a stale cache of an ASan configuration is reconfigured, not refused.
TSAN_EXCLUDE = ^(OrderingWithoutWaits\.|TsanControl\.|CollectiveOrdering\.SkippingTheStreamOrderIsCaught$$|serve\.chat_templates$$)
TSAN_ENV = TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) $(CMAKE_COMMON) $(ASAN_FLAGS) -DNPURT_TSAN=ON -DNPURT_SANITIZE=OFF -DNPURT_BENCH=OFF >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && env -u NPURT_MODEL $(TSAN_ENV) ctest --output-on-failure -j $(JOBS) -LE '^mpi$$' -E '$(TSAN_EXCLUDE)'

# The Python package: built into .venv by pip through scikit-build-core (build tree in
# build-python/, reused), then its pytest suite.
test-python: deps
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation .
	.venv/bin/python -m pytest -q tests/python

fuzz: deps
	CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$(DEBUG_PATHS)" -DNPURT_FUZZ=ON -DNPURT_BENCH=OFF >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	bash scripts/run-fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(JOBS) $(FUZZ_TARGETS)

# npurt as a dependency: install into a temporary prefix, build examples/cpp against it
# (CMake and pkg-config), install the wheel into a fresh virtual environment and run
# examples/python (build trees kept in build-install/).
test-install: deps
	JOBS=$(JOBS) bash scripts/test-install.sh

# Every code block of README.md and docs/*.md run as written, and the npurt and make
# commands quoted in their prose checked against `npurt --help` and this file (rules:
# the top of scripts/check-docs.py). `make X` lines are dry runs; builds reuse
# build-rel/ (test-install) and build-fuzz/ (fuzz); work folders in build-docs/.
test-docs: build model
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) python3 scripts/check-docs.py

test: test-release test-python test-asan test-tsan fuzz test-install test-docs

bench: build bench-ops bench-model
	./$(BUILD)/bench/npurt_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true

# Operator throughput and latency against OpenBLAS and a STREAM-style read: a table on
# stdout and the same figures as JSON in $(BUILD)/ops_bench.json. Then kernels written
# in Python (bench/kernels_bench.py): build cost per instruction, and a Python-built
# kernel against the byte-identical library one ($(BUILD)/kernels_bench.json).
bench-ops: build
	./$(BUILD)/bench/npurt_ops_bench --benchmark_out=$(BUILD)/ops_bench.json --benchmark_out_format=json
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation .
	cd bench && ../.venv/bin/python kernels_bench.py --out ../$(BUILD)/kernels_bench.json

# The MPI backend's all_reduce latency and bandwidth next to a plain MPI_Allreduce, on
# 2 ranks (as root too; more ranks than cores allowed, none pinned). COMM_MCA passes
# MPI tuning, e.g. COMM_MCA="--mca coll_libnbc_iallreduce_algorithm 1" makes the
# nonblocking all-reduce the backend uses a ring (Open MPI's default for 2 ranks is
# about half as fast at 4 MiB here).
MPIRUN = OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp
COMM_MCA ?=
bench-comm: build
	$(MPIRUN) $(COMM_MCA) -np 2 ./$(BUILD)/bench/npurt_comm_bench

# Several devices: the in-process collectives next to memcpy, tensor-parallel decode at
# 1, 2 and 4 devices in one process, then over MPI at 2 and 4 ranks (per-device weight
# bytes, collective time per token, a model of the speed-up on devices of their own).
bench-parallel: build model
	./$(BUILD)/bench/npurt_parallel_bench --model $(MODEL)
	$(MPIRUN) -np 2 ./$(BUILD)/bench/npurt_parallel_bench --mpi --model $(MODEL)
	$(MPIRUN) -np 4 ./$(BUILD)/bench/npurt_parallel_bench --mpi --model $(MODEL)

# `npurt serve` next to llama-server (built by install-peer.sh from the same llama.cpp
# source) under one load generator: aggregate tokens/s, TTFT p50/p99 and responses that
# differ from the same request alone, at 1, 4, 8 and 16 clients; JSON in $(BUILD)/serve_bench.json.
bench-serve: build model
	@bash scripts/install-peer.sh
	.venv-peer/bin/python bench/serve_bench.py --model $(MODEL) --npurt $(BUILD)/npurt --out $(BUILD)/serve_bench.json

# Peak resident memory of `npurt generate` next to llama.cpp's llama-simple, same file.
bench-resident: build model
	@bash scripts/install-peer.sh
	.venv-peer/bin/python bench/resident_bench.py --model $(MODEL) --npurt $(BUILD)/npurt --out $(BUILD)/resident_bench.json

# Gemma-3 decode tokens/s against the bandwidth floor measured in the same run.
bench-model: build model
	./$(BUILD)/bench/npurt_model_bench --model $(MODEL)

# Gemma-3 prefill and decode tokens/s next to llama.cpp on the same file, alternating
# in one run; the peer (llama-cpp-python from source) goes into .venv-peer/ first. A
# table on stdout and the same figures as JSON in $(BUILD)/peer_bench.json.
bench-peer: build model
	@bash scripts/install-peer.sh
	.venv-peer/bin/python bench/peer_bench.py --model $(MODEL) --npurt-bench $(BUILD)/bench/npurt_model_bench --out $(BUILD)/peer_bench.json

# The Gemma-3-270M Q4_K_M GGUF at $(MODEL): `npurt generate`'s default model, and the
# real-model tests' (test-release).
model:
	@bash scripts/install-model.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) build-python build-install build-rel build-docs build-example
