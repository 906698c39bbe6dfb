#!/bin/sh
# expect.sh STATUS REGEX COMMAND [ARG...]
# Runs COMMAND and passes only when it exits with STATUS ("0", or "fail" for any
# non-zero status) and its output, stdout and stderr together, matches the extended
# regular expression REGEX. (A CTest PASS_REGULAR_EXPRESSION alone ignores the exit
# status, and a ';' in it splits it into alternatives.)
status="$1"
regex="$2"
shift 2
out="$("$@" 2>&1)"
rc=$?
printf '%s\n' "$out"
if [ "$status" = fail ]; then
  [ "$rc" -ne 0 ] || { echo "expect.sh: exit status 0, expected a failure"; exit 1; }
else
  [ "$rc" -eq "$status" ] || { echo "expect.sh: exit status $rc, expected $status"; exit 1; }
fi
printf '%s\n' "$out" | grep -Eq -- "$regex" || { echo "expect.sh: no line matches: $regex"; exit 1; }
