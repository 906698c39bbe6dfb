#!/usr/bin/env bash
# Installs the llama.cpp peer for `make bench-peer` into .venv-peer/ at the repository
# root: llama-cpp-python built from PyPI's source distribution for this CPU, plus numpy.
#
# The build is not -march=native: every x86 instruction set is switched on explicitly,
# and only when /proc/cpuinfo lists it. AMX stays off whatever the CPU advertises
# (AMX instructions fault on the virtual machines this runs on).
#
# Idempotent: a stamp file records the version and the CMake arguments of the last
# successful build; when both match and the package imports, a run does nothing.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
VERSION="0.3.36"
VENV="$ROOT/.venv-peer"
STAMP="$VENV/.peer-stamp"
LOG="$VENV/build.log"

cpu_flags=""
if [ -r /proc/cpuinfo ]; then
  cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
fi

has() {
  local f
  for f in "$@"; do
    case "$cpu_flags" in *" $f "*) ;; *) return 1 ;; esac
  done
}

onoff() {
  if has "$@"; then echo ON; else echo OFF; fi
}

cmake_args() {
  local args="-DLLAVA_BUILD=OFF -DGGML_BLAS=OFF"
  if [ "$(uname -m)" != "x86_64" ]; then
    # No AMX outside x86; let ggml pick the host's features.
    echo "$args -DGGML_NATIVE=ON"
    return
  fi
  local avx512
  avx512="$(onoff avx512f avx512cd avx512vl avx512dq avx512bw)"
  args="$args -DGGML_NATIVE=OFF"
  args="$args -DGGML_SSE42=$(onoff sse4_2)"
  args="$args -DGGML_AVX=$(onoff avx)"
  args="$args -DGGML_AVX2=$(onoff avx2)"
  args="$args -DGGML_FMA=$(onoff fma)"
  args="$args -DGGML_F16C=$(onoff f16c)"
  args="$args -DGGML_BMI2=$(onoff bmi2)"
  args="$args -DGGML_AVX_VNNI=$(onoff avx_vnni)"
  args="$args -DGGML_AVX512=$avx512"
  # The AVX-512 extensions are only meaningful on top of the AVX-512 base set.
  if [ "$avx512" = ON ]; then
    args="$args -DGGML_AVX512_VBMI=$(onoff avx512vbmi)"
    args="$args -DGGML_AVX512_VNNI=$(onoff avx512_vnni)"
    args="$args -DGGML_AVX512_BF16=$(onoff avx512_bf16)"
  else
    args="$args -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF"
  fi
  args="$args -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  echo "$args"
}

ARGS="$(cmake_args)"
WANT="llama-cpp-python==$VERSION $ARGS"

# llama-batched-bench (aggregate decode of many sequences), llama-server (the peer of
# `npurt serve`) and llama-simple (the peer of `npurt generate`'s memory) from the llama.cpp the same source distribution vendors, built with the
# same instruction sets into $VENV/llama.cpp-build; their own stamp.
TOOLS_STAMP="$VENV/.peer-tools-stamp"
TOOLS_BUILD="$VENV/llama.cpp-build"
build_tools() {
  if [ -x "$TOOLS_BUILD/bin/llama-batched-bench" ] && [ -x "$TOOLS_BUILD/bin/llama-server" ] &&
    [ -x "$TOOLS_BUILD/bin/llama-simple" ] &&
    [ -f "$TOOLS_STAMP" ] && [ "$(cat "$TOOLS_STAMP")" = "$WANT" ]; then
    return
  fi
  rm -f "$TOOLS_STAMP"
  local src="$VENV/sdist"
  rm -rf "$src"
  mkdir -p "$src"
  echo "install-peer: building llama-batched-bench, llama-server and llama-simple from llama-cpp-python $VERSION's llama.cpp (several minutes)"
  "$VENV/bin/pip" download --disable-pip-version-check --no-deps --no-binary :all: -d "$src" \
    "llama-cpp-python==$VERSION" >>"$LOG" 2>&1 || die "pip download llama-cpp-python==$VERSION failed (log: $LOG)"
  tar -xzf "$src"/llama_cpp_python-"$VERSION".tar.gz -C "$src"
  # shellcheck disable=SC2086  # ARGS is a list of -D options
  cmake -S "$src/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$TOOLS_BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF $ARGS >>"$LOG" 2>&1 ||
    die "configuring llama.cpp failed (log: $LOG)"
  cmake --build "$TOOLS_BUILD" --target llama-batched-bench llama-server llama-simple -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    >>"$LOG" 2>&1 || die "building llama-batched-bench, llama-server and llama-simple failed (log: $LOG)"
  rm -rf "$src"
  echo "$WANT" >"$TOOLS_STAMP"
}

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] &&
  "$VENV/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  build_tools
  exit 0
fi

make_venv "$VENV"
command -v cmake >/dev/null || die "cmake not found (make deps installs it)"
rm -f "$STAMP"

echo "install-peer: building llama-cpp-python $VERSION from source (several minutes)"
echo "install-peer: CMAKE_ARGS=$ARGS"
start=$(date +%s)
# --no-cache-dir: a wheel cached from an earlier build with other CMake arguments
# must not be reused.
if ! CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$VENV/bin/pip" install --disable-pip-version-check --no-cache-dir --verbose \
  --no-binary llama-cpp-python "llama-cpp-python==$VERSION" numpy >"$LOG" 2>&1; then
  tail -n 40 "$LOG" >&2
  die "pip install llama-cpp-python==$VERSION failed (full log: $LOG)"
fi
"$VENV/bin/python" -c "import llama_cpp, numpy" || die "llama_cpp does not import"
echo "$WANT" >"$STAMP"
build_tools
echo "install-peer: built in $(($(date +%s) - start)) s"
