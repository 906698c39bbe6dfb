#!/bin/sh
# parallel_generate.sh CASE NPURT MODEL
# `npurt generate` over several devices, end to end. Prints "parallel_generate CASE: ok"
# and exits 0 only when the case holds:
#   same     --devices 2 and `mpirun -np 2 ... --tp 2` print the text one device prints
#   missing  rank 1's model file does not exist: both ranks fail, naming rank 1's error
#   corrupt  rank 1's file is a truncated GGUF: likewise
#   killed   rank 1 is killed mid-decode: rank 0 fails with the collective timeout
#            (2 s) instead of hanging
case_name="$1"
npurt="$2"
model="$3"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Ranks share this machine's cores: no pinning, more ranks than cores allowed.
mpirun_2="mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp -np 2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

die() {
  echo "parallel_generate $case_name: $*"
  exit 1
}

# Runs rank 1 with the model path $1 and rank 0 with the good one; output in $tmp/out.
rank1_model() {
  $mpirun_2 sh -c "if [ \"\$OMPI_COMM_WORLD_RANK\" = 1 ]; then m='$1'; else m='$model'; fi
                   exec '$npurt' generate --tp 2 --max-tokens 4 --model \"\$m\"" >"$tmp/out" 2>&1
}

case "$case_name" in
same)
  "$npurt" generate --model "$model" --max-tokens 16 >"$tmp/one" 2>/dev/null || die "one device failed"
  "$npurt" generate --model "$model" --max-tokens 16 --devices 2 >"$tmp/group" 2>/dev/null || die "--devices 2 failed"
  $mpirun_2 "$npurt" generate --model "$model" --max-tokens 16 --tp 2 >"$tmp/mpi" 2>"$tmp/err" || {
    cat "$tmp/err"
    die "--tp 2 failed"
  }
  cat "$tmp/one"
  cmp -s "$tmp/one" "$tmp/group" || die "--devices 2 printed '$(cat "$tmp/group")'"
  cmp -s "$tmp/one" "$tmp/mpi" || die "--tp 2 printed '$(cat "$tmp/mpi")'"
  ;;
missing)
  rank1_model "$tmp/no-such-model.gguf" && die "the run succeeded"
  cat "$tmp/out"
  for r in 0 1; do
    grep -q "rank $r of 2: NOT_FOUND: rank 1: no model file at $tmp/no-such-model.gguf" "$tmp/out" ||
      die "rank $r did not name rank 1's missing file"
  done
  ;;
corrupt)
  head -c 100000 "$model" >"$tmp/truncated.gguf"
  rank1_model "$tmp/truncated.gguf" && die "the run succeeded"
  cat "$tmp/out"
  for r in 0 1; do
    grep -q "rank $r of 2: INVALID_ARGUMENT: rank 1: .*truncated.gguf" "$tmp/out" ||
      die "rank $r did not name rank 1's corrupt file"
  done
  ;;
killed)
  # mpirun would kill rank 0 itself as soon as rank 1 dies; with that off, rank 0 must
  # end on its own, with its error.
  start=$(date +%s)
  $mpirun_2 --mca orte_abort_on_non_zero_status 0 sh -c "
    if [ \"\$OMPI_COMM_WORLD_RANK\" = 1 ]; then
      '$npurt' generate --tp 2 --max-tokens 2000 --model '$model' & p=\$!
      sleep 4; kill -9 \$p; exit 9
    fi
    exec '$npurt' generate --tp 2 --max-tokens 2000 --collective-timeout 2000 --model '$model'" >"$tmp/out" 2>&1
  # (mpirun's own status then says nothing: rank 0's message does.)
  took=$(($(date +%s) - start))
  tail -c 2000 "$tmp/out"
  grep -Eq "rank 0 of 2: DEADLINE_EXCEEDED: .*(all_reduce|all_gather) #[0-9]+ on rank 0 of 2: peers did not arrive within 2000 ms" \
    "$tmp/out" || die "rank 0 did not fail with the collective timeout"
  [ "$took" -lt 60 ] || die "rank 0 took $took s to give up"
  echo "rank 0 gave up within $took s of the start"
  ;;
*)
  die "unknown case"
  ;;
esac
echo "parallel_generate $case_name: ok"
