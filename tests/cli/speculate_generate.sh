#!/bin/sh
# speculate_generate.sh NPURT MODEL
# `npurt generate` with speculation, end to end: on a prompt whose continuation
# repeats, the text with drafts (the default, and --speculate 15) is the text of
# --speculate 0, and the summary tells how the drafts went; default options work for
# every short run (1 .. 8 tokens: a context shorter than the verify step); --speculate
# with the host oracle, and above 15, are refused. Prints "speculate_generate: ok" and
# exits 0 only when all of that holds.
npurt="$1"
model="$2"
prompt="Monday, Tuesday, Wednesday, Thursday,"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
die() {
  echo "speculate_generate: $*"
  exit 1
}
run() {
  "$npurt" generate --model "$model" --max-tokens 40 --prompt "$prompt" "$@"
}
run --speculate 0 >"$tmp/plain" 2>"$tmp/plain.err" || die "plain run failed: $(cat "$tmp/plain.err")"
run >"$tmp/default" 2>"$tmp/default.err" || die "default run failed: $(cat "$tmp/default.err")"
run --speculate 15 >"$tmp/15" 2>"$tmp/15.err" || die "--speculate 15 failed: $(cat "$tmp/15.err")"
[ -s "$tmp/plain" ] || die "no text"
cmp -s "$tmp/plain" "$tmp/default" || die "default speculation changed the text: $(cat "$tmp/default")"
cmp -s "$tmp/plain" "$tmp/15" || die "--speculate 15 changed the text: $(cat "$tmp/15")"
grep -Eq "^speculation: up to 7 drafts. [0-9]+ verify steps, [0-9.]+ tokens each. drafts accepted [0-9]+ of [0-9]+" \
  "$tmp/default.err" || die "no speculation summary: $(cat "$tmp/default.err")"
if grep -q "^speculation" "$tmp/plain.err"; then die "--speculate 0 printed a speculation summary"; fi
# A context shorter than the default verify step (6 prompt tokens + n) must not fail
# where plain decoding works, and must give its text.
for n in 1 2 8; do
  "$npurt" generate --model "$model" --max-tokens $n --prompt "The capital of France is" >"$tmp/short$n" 2>"$tmp/short$n.err" ||
    die "--max-tokens $n with default options failed: $(cat "$tmp/short$n.err")"
  "$npurt" generate --model "$model" --max-tokens $n --prompt "The capital of France is" --speculate 0 >"$tmp/short${n}p" 2>"$tmp/short${n}p.err" ||
    die "--max-tokens $n --speculate 0 failed"
  cmp -s "$tmp/short$n" "$tmp/short${n}p" || die "--max-tokens $n: default options changed the text: $(cat "$tmp/short$n")"
done
if run --speculate 3 --device host >"$tmp/host" 2>&1; then die "--speculate with the host oracle was accepted"; fi
grep -q "verifies drafts on one device" "$tmp/host" || die "host refusal unclear: $(cat "$tmp/host")"
if run --speculate 16 >"$tmp/big" 2>&1; then die "--speculate 16 was accepted"; fi
grep -q "speculate" "$tmp/big" || die "--speculate 16 refusal unclear: $(cat "$tmp/big")"
echo "speculate_generate: ok"
