#!/bin/sh
# sample_generate.sh NPURT MODEL
# `npurt generate` sampling end to end: a seed gives the same text run after run and
# with speculation on or off, another seed another text; --stop ends the text before
# the stop string (and names the finish); --logprobs prints a line per token; bad
# sampling options are refused by name. Prints "sample_generate: ok" and exits 0 only
# when all of that holds.
npurt="$1"
model="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
die() {
  echo "sample_generate: $*"
  exit 1
}
run() {
  "$npurt" generate --model "$model" --max-tokens 24 --prompt "Once upon a time" --temperature 0.9 --top-p 0.95 "$@"
}
run --seed 7 --speculate 0 >"$tmp/a" 2>"$tmp/a.err" || die "sampled run failed: $(cat "$tmp/a.err")"
run --seed 7 --speculate 0 >"$tmp/b" 2>/dev/null || die "second sampled run failed"
run --seed 7 --speculate 7 >"$tmp/spec" 2>/dev/null || die "speculative sampled run failed"
run --seed 8 --speculate 0 >"$tmp/other" 2>/dev/null || die "run with another seed failed"
[ -s "$tmp/a" ] || die "no text"
cmp -s "$tmp/a" "$tmp/b" || die "the same seed gave two texts: $(cat "$tmp/a") / $(cat "$tmp/b")"
cmp -s "$tmp/a" "$tmp/spec" || die "speculation changed the sampled text: $(cat "$tmp/spec")"
if cmp -s "$tmp/a" "$tmp/other"; then die "seeds 7 and 8 gave the same text: $(cat "$tmp/a")"; fi
grep -q "^finish: length" "$tmp/a.err" || die "no finish line: $(cat "$tmp/a.err")"
# A stop string taken from the greedy text: the text ends before it.
"$npurt" generate --model "$model" --max-tokens 8 --speculate 0 >"$tmp/greedy" 2>/dev/null || die "greedy run failed"
"$npurt" generate --model "$model" --max-tokens 8 --speculate 0 --stop "country" --stop "zzz" >"$tmp/stop" 2>"$tmp/stop.err" ||
  die "--stop run failed: $(cat "$tmp/stop.err")"
grep -q "country" "$tmp/greedy" || die "the greedy text lacks the stop string: $(cat "$tmp/greedy")"
if grep -q "country" "$tmp/stop"; then die "--stop printed the stop string: $(cat "$tmp/stop")"; fi
grep -q "^finish: stop_string" "$tmp/stop.err" || die "--stop finish unclear: $(cat "$tmp/stop.err")"
"$npurt" generate --model "$model" --max-tokens 4 --logprobs 3 >/dev/null 2>"$tmp/lp.err" || die "--logprobs run failed"
[ "$(grep -c '^logprobs ' "$tmp/lp.err")" -eq 4 ] || die "--logprobs 3 did not print 4 lines: $(cat "$tmp/lp.err")"
for bad in "--temperature -1:temperature" "--top-p 0:top_p" "--min-p 2:min_p" "--logprobs 21:top_logprobs"; do
  opt="${bad%%:*}"
  name="${bad##*:}"
  # shellcheck disable=SC2086
  if "$npurt" generate --model "$model" --max-tokens 2 $opt >"$tmp/bad" 2>&1; then die "$opt was accepted"; fi
  grep -q "$name" "$tmp/bad" || die "$opt refusal does not name $name: $(cat "$tmp/bad")"
done
echo "sample_generate: ok"
