#!/usr/bin/env bash
# Installs every dependency npurt needs to build, test and benchmark. Idempotent:
# packages already present are skipped, so a second run costs a few seconds.
set -euo pipefail

DEB_PACKAGES=(
  cmake ninja-build g++ clang libclang-rt-14-dev ccache pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libhwy-dev libxxhash-dev libcli11-dev
  nlohmann-json3-dev libcpp-httplib-dev curl   # JSON and HTTP of `npurt batch` and `npurt serve`; a client for its tests
  chromium chromium-driver   # a real browser for the chat page's test (tests/serve/), driven by selenium
  libopenblas-dev   # benchmark peer only
  libopenmpi-dev openmpi-bin   # collectives between processes and hosts (comm/)
  python3 python3-venv python3-dev   # the Python package (python/, .venv)
)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- Python ---------------------------------------------------------------------
# A virtual environment at .venv (repository root) with python/requirements.txt: the
# build backend and binding library for `pip install .`, numpy, ml_dtypes and pytest.
# pip runs only when the requirements changed since the last successful install (a
# stamp file in the venv holds their SHA-256), so a second run costs no network.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
REQUIREMENTS="$ROOT/python/requirements.txt"
STAMP="$VENV/.npurt-requirements.sha256"
PYTHON="${NPURT_PYTHON:-/usr/bin/python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "install-deps: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "install-deps: installing Python packages from python/requirements.txt"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  echo "$want" >"$STAMP"
fi

echo "install-deps: all dependencies present"
