#!/usr/bin/env bash
# Runs libFuzzer targets side by side, JOBS at a time, each for SECONDS from its seeds
# (fuzz/seeds/<name>/), keeping what it finds in BUILD/corpus/<name>/. A target's output
# goes to BUILD/fuzz_<name>.log: its count of runs is printed when it passes, all of it
# when it fails, and the run fails if any target did.
#   scripts/run-fuzz.sh BUILD SECONDS JOBS name...
set -euo pipefail
build=$1 seconds=$2 jobs=$3
shift 3
run_one() {
  local build=$1 seconds=$2 name=$3 log="$1/fuzz_$3.log"
  mkdir -p "$build/corpus/$name"
  if "./$build/fuzz/fuzz_$name" -max_total_time="$seconds" -seed=1 "$build/corpus/$name" "fuzz/seeds/$name" >"$log" 2>&1; then
    echo "fuzz_$name: $(grep -m1 '^Done ' "$log" || echo passed)"
    return 0
  fi
  echo "fuzz_$name FAILED; its output ($log):"
  cat "$log"
  return 1
}
export -f run_one
# xargs goes on with the other targets when one fails and exits non-zero at the end.
printf '%s\n' "$@" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ "$build" "$seconds" {}
