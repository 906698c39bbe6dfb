#!/bin/sh
# batch_prompts.sh NPURT MODEL
# `npurt batch` end to end: prompts of different lengths (one past a prefill chunk),
# greedy and seeded, give the same JSON lines with --parallel 4 as with --parallel 1;
# each line is JSON with the prompt's text, tokens and finish reason, in the prompts'
# order; "The capital of France is" continues with " the"; --stop ends a text before
# its stop string; an empty prompt line gets an error line (exit status 1) while the
# others complete; bad options are refused by name. Prints "batch_prompts: ok" and
# exits 0 only when all of that holds.
npurt="$1"
model="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
die() {
  echo "batch_prompts: $*"
  exit 1
}
long="In the beginning"
i=0
while [ $i -lt 30 ]; do
  long="$long and then the next thing happened"
  i=$((i + 1))
done
cat >"$tmp/prompts" <<PROMPTS
The capital of France is
Once upon a time
1, 2, 3, 4,
$long
The quick brown fox
Water boils at
PROMPTS
run() {
  "$npurt" batch --model "$model" --prompts "$tmp/prompts" --max-tokens 12 --prefill-chunk 32 "$@"
}
run --parallel 4 >"$tmp/g4" 2>"$tmp/g4.err" || die "greedy --parallel 4 failed: $(cat "$tmp/g4.err")"
run --parallel 1 >"$tmp/g1" 2>"$tmp/g1.err" || die "greedy --parallel 1 failed: $(cat "$tmp/g1.err")"
cmp -s "$tmp/g1" "$tmp/g4" || die "--parallel 4 changed the greedy lines: $(diff "$tmp/g1" "$tmp/g4")"
[ "$(wc -l <"$tmp/g4")" -eq 6 ] || die "not one line per prompt: $(cat "$tmp/g4")"
python3 - "$tmp/g4" <<'PY' || die "lines are not the prompts' results: $(cat "$tmp/g4")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["index"] for l in lines] == list(range(6))
for l in lines:
    assert l["finish_reason"] == "length" and len(l["tokens"]) == 12 and l["text"], l
assert lines[0]["text"].startswith(" the"), lines[0]
assert lines[3]["prompt_tokens"] > 32, lines[3]
PY
grep -q "tokens/s over all prompts" "$tmp/g4.err" || die "no summary: $(cat "$tmp/g4.err")"
run --parallel 4 --temperature 0.9 --top-p 0.95 --seed 3 >"$tmp/s4" 2>/dev/null || die "sampled --parallel 4 failed"
run --parallel 1 --temperature 0.9 --top-p 0.95 --seed 3 >"$tmp/s1" 2>/dev/null || die "sampled --parallel 1 failed"
cmp -s "$tmp/s1" "$tmp/s4" || die "--parallel 4 changed the sampled lines: $(diff "$tmp/s1" "$tmp/s4")"
if cmp -s "$tmp/s1" "$tmp/g1"; then die "sampling gave the greedy lines"; fi
# A stop string from the greedy text of the first prompt.
run --parallel 4 --stop "country" >"$tmp/stop" 2>/dev/null || die "--stop run failed"
grep -q "country" "$tmp/g4" || die "the greedy texts lack the stop string"
python3 - "$tmp/stop" <<'PY' || die "--stop did not end the text: $(head -1 "$tmp/stop")"
import json, sys
first = json.loads(open(sys.argv[1]).readline())
assert first["finish_reason"] == "stop_string" and "country" not in first["text"], first
PY
# An empty prompt: its line names the problem, the others are whole.
printf 'The capital of France is\n\nOnce upon a time\n' >"$tmp/holey"
if "$npurt" batch --model "$model" --prompts "$tmp/holey" --max-tokens 4 >"$tmp/holey.out" 2>/dev/null; then
  die "an empty prompt was accepted"
fi
python3 - "$tmp/holey.out" <<'PY' || die "empty prompt not reported: $(cat "$tmp/holey.out")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 3 and "empty" in lines[1]["error"], lines
assert len(lines[0]["tokens"]) == 4 and len(lines[2]["tokens"]) == 4, lines
PY
if "$npurt" batch --model "$model" --prompts "$tmp/none" >"$tmp/bad" 2>&1; then die "a missing prompts file was accepted"; fi
grep -q "cannot open the prompts file .*none" "$tmp/bad" || die "a missing prompts file is not named: $(cat "$tmp/bad")"
for bad in "--temperature -1:temperature" "--top-p 0:top_p" "--parallel 0:parallel"; do
  opt="${bad%%:*}"
  name="${bad##*:}"
  # shellcheck disable=SC2086
  if "$npurt" batch --model "$model" --prompts "$tmp/prompts" $opt >"$tmp/bad" 2>&1; then die "$opt was accepted"; fi
  grep -q -- "$name" "$tmp/bad" || die "$opt refusal does not name $name: $(cat "$tmp/bad")"
done
echo "batch_prompts: ok"
