#!/usr/bin/env bash
# The GPU kit is self-contained (docs/gpu.md): packs it from the build directory, unpacks it into an empty directory
# and runs its programs with a library path holding only the kit's lib/ and LibTorch's torch/lib, as on a bare GPU
# machine. Fails when a library would resolve from this machine's /usr/lib (a -dev package the GPU machine lacks),
# when the archive is over 40 MB, or when a program fails.
#
#   tests/gpu_kit/check_kit.sh BUILD_DIR TORCH_LIB PYTHON
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:?usage: check_kit.sh BUILD_DIR TORCH_LIB}" && pwd)
torch_lib=$(cd "${2:?usage: check_kit.sh BUILD_DIR TORCH_LIB PYTHON}" && pwd)
python=${3:?usage: check_kit.sh BUILD_DIR TORCH_LIB PYTHON}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$src/tools/gpu_bundle.sh" --no-build --build-dir "$build" --out "$work/gpu-kit.tar.xz"
mkdir "$work/machine"
tar xJf "$work/gpu-kit.tar.xz" -C "$work/machine"
kit="$work/machine/tessera-gpu-kit"
# The NVIDIA wheels beside torch (nvidia/cu13/lib holds libcudart, which our CUDA code links directly): the GPU
# machine's only CUDA runtime. Named first so that a toolkit this machine has (/usr/local/cuda) cannot stand in for it.
nvidia_libs=$(printf '%s:' "$torch_lib"/../../nvidia/*/lib)
export LD_LIBRARY_PATH="$kit/lib:$torch_lib:${nvidia_libs%:}"

# Every library resolves from the kit, from LibTorch's wheel (and the NVIDIA wheels its RUNPATH names), or is part of
# the base system that every GPU machine has.
base='/(libc|libm|libdl|librt|libpthread|libutil|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so'
bad=0
for p in "$kit"/bin/*; do
  while read -r name _ path _; do
    case "$path" in
      "$kit"/lib/*|"$torch_lib"/*) ;;
      */site-packages/*) ;;  # the NVIDIA wheels beside torch
      *)
        if ! [[ "$path" =~ $base ]]; then
          echo "check_kit: $(basename "$p") needs $name, which resolves to ${path:-nothing} outside the kit" >&2
          bad=1
        fi
        ;;
    esac
  done < <(ldd "$p" | awk '$2 == "=>" {print $1, $2, $3, $4}')
done
((bad == 0)) || exit 1

# The programs run from the kit: a dry run of a recipe, and CPU tests of the unit binary against the kit's src/: one
# or two per thing the kit carries (recipes and the train binary, test data, ICL tasks, tokenizers), not the unit
# tier again (the unit entries run every test; this checks that the kit's copies of them work).
cd "$work"
"$kit/bin/train" --recipe "$kit/src/recipes/mpt-125m.yaml" --dry-run --no-preflight > dry_run.txt
grep -q 'parameters' dry_run.txt || { cat dry_run.txt; echo "check_kit: the dry run printed no parameter count" >&2; exit 1; }
TESSERA_SOURCE_DIR="$kit/src" TESSERA_TRAIN_BIN="$kit/bin/train" "$kit/bin/tessera_tests" \
  --gtest_filter='Trainer.EventOrder*:Trainer.TwoRunsAreBitwiseIdentical:Checkpointing.AResumed*:TrainCli.UsageAndRuntimeExitCodes:IclTasks*:Gauntlet*:MDS*:Tokenizer*:Gpu*' \
  --gtest_brief=1
# The torchtitan peer: the kit's wheels, unzipped as gpu_check.sh does, import torchtitan's trainer and our driver's
# registrations from nothing but this Python's torch (its trainer itself then needs a GPU).
site="$work/titan-site"
mkdir "$site"
for w in "$kit"/wheels/*.whl; do "$python" -m zipfile -e "$w" "$site"; done
PYTHONPATH="$site" "$python" -s "$kit/src/benchmarks/torchtitan_llama.py" --help > titan_help.txt 2>&1 ||
  { tail -20 titan_help.txt; echo "check_kit: torchtitan's trainer does not import from the kit's wheels" >&2; exit 1; }
grep -q -- '--compile.enable' titan_help.txt || { echo "check_kit: no torchtitan usage" >&2; exit 1; }
echo "check_kit: $(stat -c %s "$work/gpu-kit.tar.xz") bytes; self-contained"
