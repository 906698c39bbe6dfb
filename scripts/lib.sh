# Sourced by the install scripts: the repository root, die() and the virtual
# environments they install into.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPT_NAME="$(basename "$0" .sh)"

# die MESSAGE...: prints "<script>: error: MESSAGE" and exits 1.
die() {
  echo "$SCRIPT_NAME: error: $*" >&2
  exit 1
}

# make_venv DIR: a virtual environment at DIR made by python3, unless DIR has one.
make_venv() {
  command -v python3 >/dev/null || die "python3 not found"
  if [ ! -x "$1/bin/python" ]; then
    python3 -m venv "$1" || die "could not create $1 (is python3-venv installed?)"
  fi
}
