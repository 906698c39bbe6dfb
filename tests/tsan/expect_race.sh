#!/bin/sh
# expect_race.sh CONTROL: passes only when CONTROL (the race control test) exits non-zero
# and ThreadSanitizer's output reports a data race in bump_unsynchronized.
out="$("$1" 2>&1)"
rc=$?
printf '%s\n' "$out"
fail() {
  echo "expect_race.sh: $*"
  exit 1
}
[ "$rc" -ne 0 ] || fail "the unsynchronized counter passed: the race detector is not working"
printf '%s\n' "$out" | grep -q "WARNING: ThreadSanitizer: data race" || fail "no ThreadSanitizer data-race report"
printf '%s\n' "$out" | grep -q "bump_unsynchronized" || fail "the report does not name bump_unsynchronized"
echo "expect_race.sh: the race was reported and failed the control"
