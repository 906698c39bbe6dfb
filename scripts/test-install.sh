#!/usr/bin/env bash
# npurt as a dependency, checked the way a user gets it:
#   (a) configure, build and install npurt (Release, no tests or benchmarks) into a
#       temporary prefix;
#   (b) build and run examples/cpp out of tree with find_package(npurt) against that
#       prefix only, then build the same program with `pkg-config --cflags --libs
#       npurt` and compile every installed header in one translation unit;
#   (c) build a wheel with `pip wheel`, install it into a fresh virtual environment
#       outside the repository (numpy and ml_dtypes besides), and from a folder
#       outside it import npurt and run examples/python/gemv.py.
# The version from project(VERSION ...) in CMakeLists.txt must be what every one of
# them reports.
#
# Build trees are kept so later runs rebuild only what changed: npurt's in build-rel/,
# configured with the flags README.md and docs/install.md give (plus -Werror and the
# other options off), so the documents' own `cmake -S . -B build-rel ...` is a no-op
# afterwards; the wheel's in build-install/python/. Everything else lives in a
# temporary folder, removed at the end.
# Environment: JOBS (parallel jobs), PYTHON (the interpreter that builds the wheel and
# makes the virtual environment; default .venv/bin/python), NPURT_WHEEL_ISOLATION=1
# (build the wheel as a plain `pip wheel .` does, in an isolated environment that pip
# fills from PyPI). By default the wheel is built with PYTHON's scikit-build-core and
# nanobind, pinned by python/requirements.txt as for `make test-python`: the check then
# does not change with upstream releases, and the compiler cache reuses test-python's
# objects.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-$(nproc)}"
BUILD="$ROOT/build-install"
BUILD_REL="$ROOT/build-rel"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/npurt-test-install.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
PREFIX="$WORK/prefix"
START=$SECONDS

step() { printf '\n== test-install: %s (at %ds)\n' "$*" "$((SECONDS - START))"; }
fail() {
  echo "test-install: FAILED: $*" >&2
  exit 1
}
# expect WHAT GOT WANT
expect() { [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"; }

VERSION="$(sed -nE 's/^project\(npurt +VERSION +([0-9]+\.[0-9]+\.[0-9]+)[ )].*/\1/p' "$ROOT/CMakeLists.txt")"
[ -n "$VERSION" ] || fail "no project(npurt VERSION X.Y.Z ...) in CMakeLists.txt"
echo "test-install: npurt $VERSION, prefix $PREFIX"

# ---- (a) build and install ------------------------------------------------------
step "configure, build and install into $PREFIX"
cmake -S "$ROOT" -B "$BUILD_REL" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNPURT_TESTS=OFF -DNPURT_BENCH=OFF \
  -DNPURT_WERROR=ON -DNPURT_FUZZ=OFF -DNPURT_PYTHON=OFF -DNPURT_SANITIZE=OFF -DNPURT_TSAN=OFF >/dev/null
cmake --build "$BUILD_REL" -j "$JOBS"
cmake --install "$BUILD_REL" --prefix "$PREFIX" >/dev/null

for f in bin/npurt include/npurt/version.h include/npurt/graph/operator_sequence.h \
  lib/cmake/npurt/npurt-config.cmake lib/cmake/npurt/npurt-config-version.cmake \
  lib/cmake/npurt/npurt-targets.cmake lib/pkgconfig/npurt.pc lib/libnpurt_base.a; do
  [ -e "$PREFIX/$f" ] || fail "not installed: $f"
done
expect "npurt --version" "$("$PREFIX/bin/npurt" --version)" "npurt $VERSION"
expect "version.h" "$(sed -nE 's/^#define NPURT_VERSION_STRING "(.*)"/\1/p' "$PREFIX/include/npurt/version.h")" "$VERSION"
if grep -rlF "$ROOT" "$PREFIX/include" "$PREFIX/lib/cmake" "$PREFIX/lib/pkgconfig"; then
  fail "installed files above name the source or build tree"
fi

# ---- (b) a C++ program against the prefix ---------------------------------------
step "examples/cpp with find_package(npurt), CMAKE_PREFIX_PATH=$PREFIX"
cp -r "$ROOT/examples/cpp" "$WORK/example-cpp"
cmake -S "$WORK/example-cpp" -B "$WORK/example-cpp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
expect "npurt_DIR" "$(sed -nE 's/^npurt_DIR:PATH=(.*)/\1/p' "$WORK/example-cpp/build/CMakeCache.txt")" \
  "$PREFIX/lib/cmake/npurt"
cmake --build "$WORK/example-cpp/build" >/dev/null
if grep -qF "$ROOT" "$WORK/example-cpp/build/compile_commands.json"; then
  fail "the example's compile commands name the repository"
fi
(cd "$WORK" && ./example-cpp/build/gemv) | tee "$WORK/gemv-cmake.txt"
grep -qx "npurt $VERSION" "$WORK/gemv-cmake.txt" || fail "the example does not print npurt $VERSION"
grep -qx ok "$WORK/gemv-cmake.txt" || fail "examples/cpp did not print ok"

step "pkg-config --cflags --libs npurt"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
expect "pkg-config --modversion npurt" "$(pkg-config --modversion npurt)" "$VERSION"
CXX="${CXX:-c++}"
# shellcheck disable=SC2046  # pkg-config's output is a list of words
"$CXX" -std=c++20 -O2 "$WORK/example-cpp/gemv.cc" -o "$WORK/gemv-pkgconfig" $(pkg-config --cflags --libs npurt)
(cd "$WORK" && ./gemv-pkgconfig) | grep -qx ok || fail "the pkg-config build of gemv.cc did not print ok"
echo "gemv.cc built with pkg-config: ok"
# Every installed header compiles on its own terms (all of them in one unit).
(cd "$PREFIX/include" && find npurt -name '*.h' | LC_ALL=C sort | sed 's/.*/#include <&>/') >"$WORK/all_headers.cc"
# shellcheck disable=SC2046
"$CXX" -std=c++20 -fsyntax-only -Wall -Wextra -Werror "$WORK/all_headers.cc" $(pkg-config --cflags npurt)
echo "$(wc -l <"$WORK/all_headers.cc") installed headers compile together: ok"

# ---- (c) the Python package -------------------------------------------------------
step "pip wheel"
[ -x "$PYTHON" ] || fail "no Python at $PYTHON (scripts/install-deps.sh makes .venv)"
ISOLATION=(--no-build-isolation)
[ "${NPURT_WHEEL_ISOLATION:-0}" = 1 ] && ISOLATION=()
CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$PYTHON" -m pip wheel "$ROOT" --no-deps --quiet --disable-pip-version-check \
  "${ISOLATION[@]}" -w "$WORK/wheels" --config-settings=build-dir="$BUILD/python"
WHEELS=("$WORK"/wheels/npurt-*.whl)
if [ ${#WHEELS[@]} != 1 ] || [ ! -f "${WHEELS[0]}" ]; then fail "pip wheel made no single npurt wheel"; fi
WHEEL="${WHEELS[0]}"
expect "wheel version" "$(basename "$WHEEL" | cut -d- -f2)" "$VERSION"
basename "$WHEEL"

step "a fresh virtual environment with the wheel"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$WHEEL"
PACKAGES="$("$WORK/venv/bin/python" -m pip list --format=freeze --disable-pip-version-check |
  cut -d= -f1 | tr 'A-Z_' 'a-z-' | grep -vxE 'pip|setuptools|wheel' | LC_ALL=C sort | tr '\n' ' ')"
expect "packages in the environment" "$PACKAGES" "ml-dtypes npurt numpy "

mkdir "$WORK/run"
cp "$ROOT/examples/python/gemv.py" "$WORK/run/"
cd "$WORK/run"
"$WORK/venv/bin/python" -c "import npurt; print('import npurt:', npurt.__version__, npurt.__file__)"
expect "npurt.__version__" "$("$WORK/venv/bin/python" -c 'import npurt; print(npurt.__version__)')" "$VERSION"
expect "the package's metadata version" \
  "$("$WORK/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("npurt"))')" "$VERSION"
"$WORK/venv/bin/python" -c "import npurt, sys; sys.exit(not npurt.__file__.startswith('$WORK/venv/'))" ||
  fail "npurt was not imported from the fresh environment"
"$WORK/venv/bin/python" gemv.py | tee "$WORK/gemv-python.txt"
grep -qx ok "$WORK/gemv-python.txt" || fail "examples/python/gemv.py did not print ok"
cd "$ROOT"

step "all checks passed in $((SECONDS - START))s"
