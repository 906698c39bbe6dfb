#!/usr/bin/env bash
# Installs every dependency npurt needs to build, test and benchmark. Idempotent:
# packages already present are skipped, so a second run costs a few seconds.
set -euo pipefail

DEB_PACKAGES=(
  cmake ninja-build g++ clang libclang-rt-14-dev ccache pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libhwy-dev libxxhash-dev libcli11-dev
  libopenblas-dev   # benchmark peer only
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
echo "install-deps: all dependencies present"
