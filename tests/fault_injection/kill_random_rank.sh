#!/usr/bin/env bash
# Fault injection: kill -9 a random rank of a 2-rank job at a random step, under the supervisor (--max-restarts)
# with autoresume, and check that the job finishes with final weights byte-identical to an uninterrupted run's.
#
#   tests/fault_injection/kill_random_rank.sh TRAIN_BIN RECIPE WORKDIR [TRIALS=10] [SEED=$RANDOM]
#
# RECIPE must train deterministically for max_duration=20ba and write its final weights with hf_checkpointer to
# <runs>/{run_name}/huggingface/ba20/model.safetensors where <runs> is the recipe's own choice; pass it as
# RUNS_DIR in the environment (default: WORKDIR/runs). Checkpoints go to SAVE_ROOT/<run name> (default: WORKDIR/ckpt;
# an s3:// prefix works too, with the S3 variables of docs/storage.md set, and should be empty). The unit suite runs a
# few trials (DistTraining.Kill*), tests/compat/test_s3_checkpoints.py a few with SAVE_ROOT in object storage; run
# this script directly for more.
set -euo pipefail

train=$1
recipe=$2
work=$3
trials=${4:-10}
seed=${5:-$RANDOM}
runs=${RUNS_DIR:-$work/runs}
save_root=${SAVE_ROOT:-$work/ckpt}
RANDOM=$seed
mkdir -p "$work"
echo "kill_random_rank: $trials trials, seed $seed"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
  echo $((20000 + RANDOM % 20000)); }

common=(fsdp_config.sharding_strategy=FULL_SHARD deterministic_mode=true save_interval=2ba max_duration=20ba
        autoresume=true)

# The uninterrupted reference.
ref=fi_reference
rm -rf "$runs/$ref" "$work/ckpt/$ref"  # (an object-store SAVE_ROOT is new and empty)
"$train" --recipe "$recipe" --nproc-per-node 2 --master-port "$(free_port)" run_name=$ref \
  save_folder="$save_root/$ref" "${common[@]}" > "$work/$ref.log" 2>&1 || { cat "$work/$ref.log"; exit 1; }
want="$runs/$ref/huggingface/ba20/model.safetensors"
[ -f "$want" ] || { echo "no reference weights at $want"; exit 1; }

# Process ids of the launcher's children (the ranks) and their RANK.
rank_pid() {  # launcher_pid rank
  local c
  for c in $(pgrep -P "$1" || true); do
    if tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx "RANK=$2"; then echo "$c"; return 0; fi
  done
  return 1
}

failures=0
for ((t = 1; t <= trials; t++)); do
  name=fi_trial$t
  step=$((2 + RANDOM % 16))  # kill once the job has logged this many steps
  victim=$((RANDOM % 2))
  rm -rf "$runs/$name" "$work/ckpt/$name"
  "$train" --recipe "$recipe" --nproc-per-node 2 --max-restarts 2 --master-port "$(free_port)" run_name=$name \
    save_folder="$save_root/$name" "${common[@]}" > "$work/$name.log" 2>&1 &
  launcher=$!
  killed=0
  while kill -0 "$launcher" 2>/dev/null; do
    done_steps=$(grep -c '"loss/train/total"' "$runs/$name/metrics.jsonl" 2>/dev/null || true)
    if [ "${done_steps:-0}" -ge "$step" ] && pid=$(rank_pid "$launcher" "$victim"); then
      kill -9 "$pid"
      killed=1
      break
    fi
    sleep 0.02
  done
  rc=0
  wait "$launcher" || rc=$?
  result=ok
  if [ "$killed" != 1 ]; then
    result="the job ended before the kill"
  elif [ "$rc" != 0 ]; then
    result="exit code $rc"
  elif ! grep -q "restart 1/2" "$work/$name.log"; then
    result="no restart logged"
  elif ! cmp -s "$want" "$runs/$name/huggingface/ba20/model.safetensors"; then
    result="final weights differ from the uninterrupted run's"
  fi
  echo "trial $t: kill -9 rank $victim after step $step: $result"
  if [ "$result" != ok ]; then
    failures=$((failures + 1))
    tail -n 30 "$work/$name.log"
  fi
done
echo "kill_random_rank: $((trials - failures))/$trials trials passed"
[ "$failures" = 0 ]
