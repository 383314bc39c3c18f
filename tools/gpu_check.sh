#!/usr/bin/env bash
# Runs the GPU kit on a GPU machine: the unit tests (the GPU tests and every CPU test, which must hold on a machine
# with a GPU too), then the GPU benchmarks, and writes a report (JSON + Markdown) to REPORT_DIR. docs/gpu.md.
#
#   tar xJf gpu-kit.tar.xz && tessera-gpu-kit/src/tools/gpu_check.sh REPORT_DIR [--quick] [--tests-only]
#                                                                    [--benchmarks-only] [--shapes llama1b,125m,1b]
#
# LibTorch comes from the machine's PyTorch (`python3 -c 'import torch'`; override with TESSERA_TORCH_LIB), which must
# be the CUDA build of the version the kit was built against. --quick: the GPU tests only and the 125m benchmark.
# The benchmarks start no case after TESSERA_BENCH_BUDGET_S (default 330 s), so that tests and benchmarks fit in one
# device call of 8 minutes; the shapes run in the order given (the Llama shape, with its torchtitan peer, first).
set -uo pipefail

kit=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
report=${1:?usage: gpu_check.sh REPORT_DIR [--quick] [--tests-only]}
shift
quick=0
tests_only=0
benchmarks_only=0
shapes=llama1b,125m,1b
while (($#)); do
  case "$1" in
    --quick) quick=1; shapes=125m; shift ;;
    --tests-only) tests_only=1; shift ;;
    --benchmarks-only) benchmarks_only=1; shift ;;
    --shapes) shapes=$2; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$report"
report=$(cd "$report" && pwd)
python=${PYTHON:-python3}
torch_lib=${TESSERA_TORCH_LIB:-$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')}
torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)
# The NVIDIA wheels beside torch hold the CUDA runtime (libcudart) that our CUDA code links directly.
nvidia_libs=$(cd "$torch_lib/../../nvidia" 2>/dev/null && printf "$PWD/%s:" */lib)
export LD_LIBRARY_PATH="$kit/lib:$torch_lib${nvidia_libs:+:${nvidia_libs%:}}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TESSERA_SOURCE_DIR="$kit/src" TESSERA_TRAIN_BIN="$kit/bin/train"
log() { printf '[gpu_check] %s\n' "$*" | tee -a "$report/gpu_check.log"; }

log "kit commit $(cat "$kit/COMMIT"); torch $torch_version at $torch_lib"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$report/gpu_check.log"
missing=$(ldd "$kit/bin/train" "$kit/bin/tessera_tests" | grep 'not found' | sort -u)
if [ -n "$missing" ]; then
  log "missing shared libraries:"; echo "$missing" | tee -a "$report/gpu_check.log"; exit 1
fi
"$kit/bin/train" --help > /dev/null || { log "train does not start"; exit 1; }

# ---- Unit tests: the GPU tests first, then the rest in parallel shards ---------------------------------------------
cd "$report"
status=0
if ((!benchmarks_only)); then
  log "GPU tests"
  "$kit/bin/tessera_tests" --gtest_filter='Gpu*' --gtest_output="json:$report/gpu_tests.json" \
    > "$report/gpu_tests.log" 2>&1 || status=1
  tail -n 40 "$report/gpu_tests.log"
fi
if ((!quick && !benchmarks_only)); then
  shards=${TESSERA_TEST_SHARDS:-8}
  log "all unit tests on this GPU machine ($shards shards)"
  pids=()
  for ((i = 0; i < shards; i++)); do
    OMP_NUM_THREADS=2 GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i TMPDIR=$(mktemp -d) \
      "$kit/bin/tessera_tests" --gtest_filter='-Gpu*' \
      --gtest_output="json:$report/unit_shard$i.json" > "$report/unit_shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      status=1
      log "shard $i failed:"; grep -E '^\[  FAILED  \]|Failure|error' "$report/unit_shard$i.log" | head -40
    fi
  done
fi

# ---- Benchmarks ----------------------------------------------------------------------------------------------------
if ((!tests_only)); then
  # torchtitan's trainer and its dependencies: pure-Python wheels, unzipped onto a path of their own (no pip needed).
  site="$report/titan-site"
  mkdir -p "$site"
  for w in "$kit"/wheels/*.whl; do [ -f "$w" ] && "$python" -m zipfile -e "$w" "$site"; done
  log "GPU benchmarks: $shapes (with amp_fp8, torchtitan and a profile of each shape's Tessera step)"
  PYTHONUNBUFFERED=1 "$python" "$kit/src/benchmarks/gpu_train_vs_pytorch.py" --bench "$kit/bin/bench_gpu_train_step" \
    --shapes "$shapes" --compile-shapes llama1b,125m --budget-s "${TESSERA_BENCH_BUDGET_S:-330}" --case-timeout 180 \
    --fp8 --titan-site "$site" --profile "$report/profiles" --out "$report" 2>&1 |
    tee "$report/gpu_benchmarks.log" || status=1
fi

# ---- Report --------------------------------------------------------------------------------------------------------
"$python" - "$report" <<'PY'
import glob, json, os, sys
report = sys.argv[1]
summary = {"tests": 0, "failures": 0, "skipped": 0, "failed": []}
for f in sorted(glob.glob(os.path.join(report, "*.json"))):
    if os.path.basename(f) in ("gpu_benchmarks.json", "report.json"):
        continue
    d = json.load(open(f))
    for suite in d.get("testsuites", []):
        for t in suite.get("testsuite", []):
            if t.get("status") != "RUN":
                continue
            summary["tests"] += 1
            if t.get("result") == "SKIPPED":
                summary["skipped"] += 1
            if t.get("failures"):
                summary["failures"] += 1
                summary["failed"].append(f"{suite['name']}.{t['name']}")
                # What failed, without the stack frames of exceptions.
                text = "\n".join(f.get("failure", "") for f in t["failures"])
                text = "\n".join(l for l in text.splitlines() if not l.startswith("frame #"))
                summary.setdefault("messages", {})[f"{suite['name']}.{t['name']}"] = text[:3000]
bench = os.path.join(report, "gpu_benchmarks.json")
out = {"unit_tests": summary, "benchmarks": json.load(open(bench)) if os.path.exists(bench) else None}
json.dump(out, open(os.path.join(report, "report.json"), "w"), indent=1)
md = [f"# GPU check", "", f"Unit tests: {summary['tests']} run, {summary['failures']} failed, {summary['skipped']} skipped."]
md += [f"- failed: {n}" for n in summary["failed"]]
for name, text in summary.get("messages", {}).items():
    md += ["", f"### {name}", "", "```", text, "```"]
if os.path.exists(os.path.join(report, "gpu_benchmarks.md")):
    md += ["", "## Training step on one GPU", "", open(os.path.join(report, "gpu_benchmarks.md")).read()]
open(os.path.join(report, "report.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
log "report: $report/report.md (exit $status)"
exit $status
