#!/usr/bin/env bash
# Fault injection: kill -9 a random rank of a 2-rank (NPROC) job at a random step, under the supervisor
# (--max-restarts) with autoresume, and check that the job finishes with final weights byte-identical to an
# uninterrupted run's.
#
#   tests/fault_injection/kill_random_rank.sh TRAIN_BIN RECIPE WORKDIR [TRIALS=10] [SEED=$RANDOM]
#
# RECIPE must train deterministically for max_duration=20ba and write its final weights with hf_checkpointer to
# <runs>/{run_name}/huggingface/ba20/model.safetensors where <runs> is the recipe's own choice; pass it as
# RUNS_DIR in the environment (default: WORKDIR/runs). Checkpoints go to SAVE_ROOT/<run name> (default: WORKDIR/ckpt;
# an s3:// prefix works too, with the S3 variables of docs/storage.md set, and should be empty). The unit suite runs a
# few trials (DistTraining.Kill*), tests/compat/test_s3_checkpoints.py a few with SAVE_ROOT in object storage; run
# this script directly for more.
# NPROC: the job's ranks (default 2). EXTRA: more overrides for every run (space-separated). FINAL=checkpoint compares
# the rank files of the last checkpoint (SAVE_ROOT/<run>/ep0-ba20) instead of hf_checkpointer's weights, for models
# transformers has no class for. LAUNCH_FLAGS: more launcher flags for the interrupted runs only (space-separated;
# e.g. --fork-ranks: the uninterrupted reference then runs without it, and the trials must end equal to it).
set -euo pipefail

train=$1
recipe=$2
work=$3
trials=${4:-10}
seed=${5:-$RANDOM}
runs=${RUNS_DIR:-$work/runs}
save_root=${SAVE_ROOT:-$work/ckpt}
nproc=${NPROC:-2}
final=${FINAL:-hf}
read -r -a extra <<< "${EXTRA:-}"
read -r -a launch_flags <<< "${LAUNCH_FLAGS:-}"
RANDOM=$seed
mkdir -p "$work"
echo "kill_random_rank: $trials trials, seed $seed (rerun the same kills with SEED=$seed as the fifth argument)"

# --master-port 0: each launcher binds a free port itself (no probe another job could race).
common=(fsdp_config.sharding_strategy=FULL_SHARD deterministic_mode=true save_interval=2ba max_duration=20ba
        autoresume=true "${extra[@]}")

# The uninterrupted reference.
ref=fi_reference
rm -rf "$runs/$ref" "$work/ckpt/$ref"  # (an object-store SAVE_ROOT is new and empty)
"$train" --recipe "$recipe" --nproc-per-node "$nproc" --master-port 0 run_name=$ref \
  save_folder="$save_root/$ref" "${common[@]}" > "$work/$ref.log" 2>&1 || { cat "$work/$ref.log"; exit 1; }
# The final weights of run $1: hf_checkpointer's file, or the last checkpoint's rank files.
final_weights() {
  if [ "$final" = checkpoint ]; then
    ls "$save_root/$1/ep0-ba20/"rank*.safetensors 2>/dev/null || true
  else
    echo "$runs/$1/huggingface/ba20/model.safetensors"
  fi
}
same_weights() {  # run: whether its final weights equal the reference's byte for byte
  local a b i
  read -r -a a <<< "$(final_weights "$ref" | tr '\n' ' ')"
  read -r -a b <<< "$(final_weights "$1" | tr '\n' ' ')"
  [ "${#a[@]}" = "${#b[@]}" ] || return 1
  for ((i = 0; i < ${#a[@]}; i++)); do cmp -s "${a[i]}" "${b[i]}" || return 1; done
}
want=$(final_weights "$ref")
[ -n "$want" ] || { echo "no reference checkpoint at $save_root/$ref/ep0-ba20"; exit 1; }
for f in $want; do [ -f "$f" ] || { echo "no reference weights at $f"; exit 1; }; done

# The process id of the launcher's child (a rank) with RANK $2; with ranks forked from the launcher (--fork-ranks), whose
# /proc/PID/environ is the launcher's, the $2-th child to start (the launcher starts them in rank order).
rank_pid() {  # launcher_pid rank
  local c children
  children=$(pgrep -P "$1" || true)
  for c in $children; do
    if tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx "RANK=$2"; then echo "$c"; return 0; fi
  done
  if [[ " ${launch_flags[*]} " == *" --fork-ranks "* ]] && [ "$(wc -w <<< "$children")" = "$nproc" ]; then
    # Field 22 of /proc/PID/stat is the start time (after the command name, which may hold spaces).
    for c in $children; do echo "$(sed 's/.*) //' "/proc/$c/stat" | cut -d' ' -f20) $c"; done | sort -n -k1,1 -k2,2 |
      sed -n "$(($2 + 1))p" | cut -d' ' -f2 | grep .
    return
  fi
  return 1
}

# One trial: start the job, kill -9 rank $2 once it has logged $1 steps. Sets `killed` (0 when the job ended first),
# `rc` and `result`.
trial() {  # step victim name
  local step=$1 victim=$2 name=$3 launcher pid done_steps
  rm -rf "$runs/$name" "$work/ckpt/$name"
  "$train" --recipe "$recipe" --nproc-per-node "$nproc" --max-restarts 2 --master-port 0 "${launch_flags[@]}" \
    run_name="$name" save_folder="$save_root/$name" "${common[@]}" > "$work/$name.log" 2>&1 &
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
  elif ! same_weights "$name"; then
    result="final weights differ from the uninterrupted run's"
  fi
}

failures=0
for ((t = 1; t <= trials; t++)); do
  name=fi_trial$t
  step=$((2 + RANDOM % 16))  # kill once the job has logged this many steps
  victim=$((RANDOM % nproc))
  trial "$step" "$victim" "$name"
  # A job can outrun the poll and end before its kill (a fast machine, a late step): that trial tested nothing, so it
  # runs again with an earlier step rather than failing (up to 3 times).
  for ((again = 1; again <= 3 && killed == 0; again++)); do
    echo "trial $t: the job ended before the kill at step $step; again with step $((step / 2 + 1))"
    step=$((step / 2 + 1))
    trial "$step" "$victim" "$name"
  done
  echo "trial $t: kill -9 rank $victim after step $step: $result"
  if [ "$result" != ok ]; then
    failures=$((failures + 1))
    tail -n 30 "$work/$name.log"
  fi
done
echo "kill_random_rank: $((trials - failures))/$trials trials passed"
[ "$failures" = 0 ]
