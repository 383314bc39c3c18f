#!/usr/bin/env bash
# Builds the unit test binary (and `train`, which its tests start) with sanitizers in a build tree of its own, and runs
# the unit suite under them (docs/testing.md):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (+ libstdc++ assertions): the unit suite, multi-process tests
#         included (the ranks and the `train` processes they start are the instrumented builds too), in two shards
#         side by side; a few tests that only repeat covered paths many times are left out (below).
#   tsan  ThreadSanitizer: the tests that run threads of our own: the loader's workers, the asynchronous checkpoint
#         writer, the launcher (output forwarding, watchdog, signals) and heartbeats, plus the collectives.
# LibTorch and the Debian libraries are the prebuilt, uninstrumented ones; tools/sanitizers/ holds the suppressions
# for reports inside them (each says why). Any report fails the run; the logs stay in LOG_DIR/logs/.
# The instrumented tree is built at one path whatever the checkout: TESSERA_SANITIZE_TREES/MODE (default
# ~/.cache/tessera/sanitize/MODE), whose build/ compiles the checkout through the link src -> it. Its unity sources
# name every file by that path, so a fresh clone anywhere (CI's) compiles them to the same objects and ccache serves
# them; from another checkout's tree they would all be compiled again (~17 min for ASan). A lock keeps two checkouts
# from sharing the tree at once.
# Usage: tools/sanitize.sh asan|tsan [LOG_DIR (default build/asan or build/tsan)]
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=${1:?usage: tools/sanitize.sh asan|tsan [LOG_DIR]}
case "$MODE" in
  asan) SANITIZE=address,undefined ;;
  tsan) SANITIZE=thread ;;
  *) echo "tools/sanitize.sh: unknown mode '$MODE' (asan or tsan)" >&2; exit 2 ;;
esac
OUT=${2:-$SRC/build/$MODE}
SUPP=$SRC/tools/sanitizers
TREES=${TESSERA_SANITIZE_TREES:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/sanitize}
ROOT=$TREES/$MODE
BUILD=$ROOT/build
mkdir -p "$ROOT" "$OUT"
exec 9> "$ROOT.lock"
if ! flock -n 9; then
  echo "sanitize $MODE: waiting for another checkout's run to finish with $ROOT" >&2
  flock 9
fi
ln -sfn "$SRC" "$ROOT/src"
# ninja decides by timestamps alone, and another checkout's files may be older than this tree's objects yet differ:
# after a change of checkout every object is compiled again (from ccache, for the files that did not change).
if [[ "$(cat "$ROOT/checkout" 2>/dev/null)" != "$SRC" ]]; then
  [[ -f "$BUILD/build.ninja" ]] && ninja -C "$BUILD" -t clean > /dev/null
  echo "$SRC" > "$ROOT/checkout"
fi

# -O1: the sanitizers' usual level (readable reports, tolerable speed); -g1: line tables for the reports without the
# full debug info of LibTorch's headers, which would double the compile time. A unity build (batches of 8 sources
# as one translation unit) compiles this tree in about half the time when ccache has none of it.
CONFIGURE=(-G Ninja -DTESSERA_SANITIZE=$SANITIZE -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1"
  -DTESSERA_BUILD_BENCHMARKS=OFF -DTESSERA_WERROR=OFF -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8)
# Configured anew when these options change (a checkout with another version of this script).
if [[ ! -f "$BUILD/build.ninja" || "$(cat "$BUILD/.tessera-configure" 2>/dev/null)" != "${CONFIGURE[*]}" ]]; then
  rm -rf "$BUILD"
  cmake -S "$ROOT/src" -B "$BUILD" "${CONFIGURE[@]}" > "$OUT/configure.log" 2>&1 ||
    { cat "$OUT/configure.log"; exit 1; }
  echo "${CONFIGURE[*]}" > "$BUILD/.tessera-configure"
fi
# TSan runs the threaded tests only, from a binary of just their files (tests/CMakeLists.txt).
TARGET=tessera_tests
[[ $MODE == tsan ]] && TARGET=tessera_thread_tests
cmake --build "$BUILD" --target "$TARGET"

LOGS=$OUT/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
export TESSERA_SOURCE_DIR=$SRC
# One intra-op thread: LibTorch's OpenMP pool synchronises through libgomp, which the sanitizers cannot see into;
# our own threads are what these runs are for.
export OMP_NUM_THREADS=1
BIN=$BUILD/bin/$TARGET

run_shard() {  # run_shard NAME FILTER [INDEX TOTAL]
  local name=$1 filter=$2
  if [[ $# -ge 4 ]]; then
    GTEST_SHARD_INDEX=$3 GTEST_TOTAL_SHARDS=$4 "$BIN" --gtest_filter="$filter" > "$LOGS/$name.log" 2>&1
  else
    "$BIN" --gtest_filter="$filter" > "$LOGS/$name.log" 2>&1
  fi
}

status=0
if [[ $MODE == asan ]]; then
  # allocator_may_return_null: an allocation too large to serve fails as it does without ASan (LibTorch's allocator
  # then throws), which Trainer.AutoMicrobatchingHalvesAndRetriesWhenAnAllocationFails relies on. protect_shadow_gap=0
  # lets the CUDA runtime that LibTorch loads map its memory.
  export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:protect_shadow_gap=0:detect_stack_use_after_return=0:strict_string_checks=1:check_initialization_order=1:detect_odr_violation=0"
  export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp"
  # Left out (they repeat, many times over, code paths that other tests here run under ASan too; the normal build runs
  # them all): the kill at each of a save's 32 steps (SaveFaults.AFailure* fails the same steps in-process), the Llama
  # repeats of the multi-rank training tests, the random-kill trials, the 3-rank ICL split (the evaluation code
  # runs in-process here), two tests that read recipes in many `train` processes, and those below.
  asan_skip='Gpu*:SaveFaults.AKillAtEveryStep*:DistTrainingLlama.*:DistTraining.KillingARandomRank*'
  asan_skip+=':DistTrainingMoe.ExpertParallelKill*'
  # The expert-parallel layouts and resumes (13 runs of up to 4 ranks) repeat what the 2-rank expert-parallel
  # auto-microbatching test runs here; the hostile chat template runs its million-statement limit (134 s under
  # ASan; the template engine's other tests run here); the scheduler's random instances repeat one algorithm.
  asan_skip+=':DistTrainingMoe.ExpertParallelLayouts*Reshard:ChatTemplate.HostileTemplatesHitLimitsNotTheMachine'
  asan_skip+=':Schedule.EveryPolicyMeetsTheConstraintsOnRandomInstances'
  # The tensor-parallel layouts, resumes, HYBRID_SHARD and auto-microbatching runs (15 runs of up to 4 ranks) repeat
  # what TP 2 x FSDP 2 runs here.
  asan_skip+=':DistTraining.TensorParallelLayoutsMatchOneProcessAndTheirCheckpointsReshard'
  asan_skip+=':DistTraining.TensorParallelComposesWithHybridShardAndAutoMicrobatching'
  # The context-parallel training runs (6 runs of up to 4 ranks) repeat, through `train`, the model code that
  # DistContextParallel.ShardsMatchTheWholeSequence runs here on 4 ranks (forward, backward, gathers, masks).
  asan_skip+=':DistTraining.ContextParallelMatchesOneProcessAndComposesWithTensorParallelism'
  # A stopped rank's hang: the launcher gives the other rank a grace to exit, and an ASan rank's leak check at exit
  # (LeakSanitizer scanning a LibTorch process's heap) outlasted even the scaled grace (18.9 s) on 2026-11-29; the
  # normal build runs it, and the launcher's watchdog and signal paths run under TSan (Launcher.*, KilledRank*).
  asan_skip+=':DistTraining.AStoppedRankIsCaughtNamedAndTheRestartedJobEndsBitwiseEqual'
  asan_skip+=':DistTraining.IclEvaluationSplitOverRanks*'
  # The dry run of every shipped recipe and the bad-recipe messages start ~40 instrumented `train` processes to read
  # recipes; the recipe reader runs under ASan in-process here (config tests) and in the fuzz_recipe_yaml target.
  asan_skip+=':TrainCli.DryRunOfEveryShippedRecipeSucceeds:TrainCli.BadRecipesNameFileKeyAndLine'
  # The per-family parallel tests run one shared engine (parallelize, its plans as data) over each family's model; here
  # the first dense family (GPT-NeoX, TP 2 x FSDP 2 and CP 2 x FSDP 2), Gemma 3 (sliding windows and local rotary
  # tables under CP), Mixtral and DeepSeek-V3 (its latent attention and shared experts under EP 2 x FSDP 2) run, and
  # every family's model runs in-process in its own tests here; the other 14 instances (~210 s of the two shards)
  # repeat that engine.
  asan_skip+=':FamilyParallel/1*:FamilyParallel/2*:FamilyParallel/4*:FamilyParallel/5*:FamilyParallel/6*'
  asan_skip+=':FamilyParallel/7*:FamilyParallel/8*:FamilyParallel/9*:FamilyExpertParallel/1*:FamilyExpertParallel/3*'
  asan_skip+=':FamilyExpertParallel/4*'
  # The `tessera` program's help, version and old-name runs (starts of the instrumented program) repeat one
  # dispatcher; its completion and unknown-command tests run here.
  asan_skip+=':TesseraCli.EveryCommandHasHelpAndAVersionUnderItsName:TesseraCli.TheOldProgramNamesRunTheirCommands'
  # Measured on 2026-12-06 as the slowest here (54, 39, 39 and 23 s of the shards' 856 s), each repeating code that
  # other tests run under ASan: the preemption run (its signal and save paths: TSan's Checkpointing.* and Launcher.*,
  # and the checkpoint tests here), the world-size reshard grid (ReshardingKeepsTheOptimizerMoments... reshards here),
  # an elastic host's refusal message (the other Elastic.* tests run its rendezvous here) and the planner's kill and
  # lost-core replan (PlanExecutor.* and PlanRun.Profiling* run the executor here).
  asan_skip+=':DistTraining.PreemptionSignalSavesACheckpointAndTheRequeuedRunEndsBitwiseEqual'
  asan_skip+=':DistTraining.CheckpointsReshardAcrossWorldSizesAndStrategies:Elastic.TheHostRefusesANodeThatDoesNotFit*'
  asan_skip+=':PlanRun.AKilledJobAndALostCoreAreReplannedAndEveryJobFinishes'
  # Measured on 2026-12-07 as the slowest left (47, 35, 33, 25, 24, 22 and 17 s of the shards' 967 s), each repeating
  # under ASan what a kept test runs: Composer's data-parallel mesh (HybridShardOverTwoNodes runs the replicated
  # shards), the layouts refused by name (their checks run in-process in the config and parallelize tests; the refusal
  # is a message before any rank trains), the three-node elastic job (Elastic.ALostNodeIsExcluded runs the exclusion),
  # the timed-out collective (TSan runs DistCollectives.*), ZeRO-2 (FullShardOnTwoAndFourRanks runs the same reduce-
  # scatter with the parameters sharded too) and the bf16-emulation warning (a precision choice before training).
  asan_skip+=':DistTraining.ComposersDataParallelMeshShardsWithinGroupsAndReplicatesAcrossThem'
  asan_skip+=':DistTraining.TensorParallelLayoutsTheEngineCannotBuild*:DistTrainingMoe.ExpertParallelLayoutsTheEngineCannotBuild*'
  asan_skip+=':DistTraining.AThreeNodeElasticJobLosesANodeAndFinishesOnTwo:DistCollectives.ATimedOutCollective*'
  asan_skip+=':DistTraining.ShardGradOpOnTwoAndFourRanksMatchesOneProcess:TrainCli.OnACpuThatEmulatesBf16*'
  run_shard shard0 "-$asan_skip" 0 2 & p0=$!
  run_shard shard1 "-$asan_skip" 1 2 & p1=$!
  wait $p0 || status=1
  wait $p1 || status=1
else
  export TSAN_OPTIONS="suppressions=$SUPP/tsan.supp:halt_on_error=0:second_deadlock_stack=1:history_size=4"
  # Not Checkpointing.AFailingDisk*: it runs `train` under `ulimit -f`, and TSan's runtime itself dies of SIGBUS
  # under a small file-size limit.
  # Nor Launcher.ForkedRanksRun*: TSan's runtime runs a thread of its own, so a launcher under it always starts its
  # ranks with exec (Launcher.ForkedRanksFallBackToExec* runs that path here).
  run_shard threads 'TokenLoader.*:Tokenizer.SaveLoadAndThreads:Checkpointing.*:LossSpikes.*:Launcher.*:Heartbeat.*:DistCollectives.*:DistTraining.KilledRankStopsTheJobWithinThirtySeconds-Checkpointing.AFailingDisk*:Launcher.ForkedRanksRun*' || status=1
fi

# A report in a child process (a rank, a `train`) fails that child and so its test; say where to look either way.
reports=$(grep -l -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer" "$LOGS"/*.log || true)
for f in $reports; do
  echo "== sanitizer report in $f" >&2
  grep -n -A30 -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer" "$f" | head -80 >&2
  status=1
done
for f in "$LOGS"/*.log; do
  grep -E "^\[  (PASSED|FAILED)  \]|tests? ran" "$f" | sed "s|^|$(basename "$f" .log): |"
done
if [[ $status -ne 0 ]]; then
  grep -h "^\[  FAILED  \]" "$LOGS"/*.log >&2 || true
  echo "sanitize $MODE: FAILED (logs in $LOGS)" >&2
  exit 1
fi
echo "sanitize $MODE: clean"
