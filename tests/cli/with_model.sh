#!/bin/sh
# with_model.sh COMMAND [ARG...]: runs COMMAND with every argument @MODEL@ replaced by
# $NPURT_MODEL, the real Gemma-3 file; without one it prints "no model: skipped" and
# exits 0 (the tests' SKIP_REGULAR_EXPRESSION). The real-model tests follow NPURT_MODEL
# as the gtests do: make test-release sets it; the sanitizer suites leave it unset, a
# real-model run being minutes there.
if [ -z "$NPURT_MODEL" ] || [ ! -f "$NPURT_MODEL" ]; then
  echo "no model: skipped (set NPURT_MODEL to the Gemma-3-270M file to run this test)"
  exit 0
fi
for a in "$@"; do
  shift
  if [ "$a" = "@MODEL@" ]; then set -- "$@" "$NPURT_MODEL"; else set -- "$@" "$a"; fi
done
exec "$@"
