#!/usr/bin/env bash
# Builds and runs the research example as its own user would (ctest -R example_research; docs/api.md#installing):
# installs Tessera from BUILD_DIR into a prefix, moves the prefix (the package is relocatable), configures and builds
# examples/research against it with find_package(Tessera), and runs research_lm and the installed tools (with the
# research components as a plug-in: `tessera train`, export the checkpoint, evaluate ICL tasks on it, sample from it). Then checks
# that a project which adds Tessera with add_subdirectory builds the library and tools only, no test or benchmark.
#
#   examples/research/check.sh BUILD_DIR WORK_DIR [GENERATOR] [CXX_COMPILER]
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:?usage: check.sh BUILD_DIR WORK_DIR [GENERATOR] [CXX_COMPILER]}" && pwd)
work=${2:?usage: check.sh BUILD_DIR WORK_DIR [GENERATOR] [CXX_COMPILER]}
generator=${3:-Ninja}
cxx=${4:-c++}
mkdir -p "$work"
work=$(cd "$work" && pwd)

# Install, then move: nothing in the package may name the prefix it was installed to.
rm -rf "$work/staging" "$work/prefix"
cmake --install "$build" --prefix "$work/staging" > "$work/install.log"
mv "$work/staging" "$work/prefix"
prefix="$work/prefix"
if grep -rlI --exclude='*.a' "$work/staging" "$prefix" > "$work/stale.txt"; then
  echo "check.sh: the installed package names its install prefix in:" >&2
  cat "$work/stale.txt" >&2
  exit 1
fi
test ! -e "$prefix/include/tessera/util/subprocess.h" || { echo "check.sh: an internal header was installed" >&2; exit 1; }

# The research project, configured and built against the moved prefix. ccache, where present, makes reruns quick, in
# a fresh clone too (CI's): with the checkout as its base directory it hashes the paths under it (the sources, the
# prefix in the build tree) relative to the build directory, the same in every clone.
launcher=()
if command -v ccache > /dev/null; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$src;CCACHE_NOHASHDIR=true;ccache")
fi
cmake -S "$src/examples/research" -B "$work/build" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build"
"$work/build/research_lm"

# The installed tools run from the prefix (their RUNPATH finds libtessera and LibTorch), and with the components as a
# plug-in they train the research recipe and export its checkpoint; without it, convert names the unknown model_type.
"$prefix/bin/tessera" --version
"$prefix/bin/train" --version | grep -q '^train (Tessera'  # the old program names, links to tessera, for this release
grep -q 'complete -o filenames -F _tessera_complete tessera' "$prefix/share/bash-completion/completions/tessera"
"$prefix/bin/tessera" train --recipe "$src/recipes/mpt-125m.yaml" --dry-run --no-preflight | grep -q parameters
plugin="$work/build/libresearch_lm_plugin.so"
run="$work/tools-run"
rm -rf "$run"
"$work/build/research_lm" data "$run/data"
"$prefix/bin/tessera" train --plugin "$plugin" --recipe "$src/examples/research/research.yaml" \
  variables.data_local="$run/data" save_folder="$run/ckpt" loggers.jsonl.filename="$run/metrics.jsonl" \
  max_duration=4ba eval_interval=2ba fsdp_config.sharding_strategy=NO_SHARD
grep -q '"metrics/eval/Top5Accuracy"' "$run/metrics.jsonl" ||
  { echo "check.sh: tessera train --plugin logged no Top5Accuracy" >&2; exit 1; }
"$prefix/bin/tessera" export --plugin "$plugin" --checkpoint "$run/ckpt" --hf-out "$run/hf"
"$work/build/research_lm" same-logits "$run/ckpt/latest" "$run/hf"
# The installed eval and generate on the research model's export, through the plug-in: ICL accuracies, and samples.
"$prefix/bin/tessera" eval --plugin "$plugin" --model "$run/hf" --tokenizer "$run/data/tokenizer.json" \
  --tasks "$run/data/icl_tasks.yaml" --output "$run/icl.json" --log-level warn
python3 - "$run/icl.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
text = json.dumps(rows)
assert text.count("InContextLearningLMAccuracy") == 2 and "InContextLearningMultipleChoiceAccuracy" in text, text
PY
"$prefix/bin/tessera" generate --plugin "$plugin" --model "$run/hf" --tokenizer "$run/data/tokenizer.json" \
  --prompt "the cat sat on" --prompt "the owl" --max-new-tokens 6 --output "$run/generated.jsonl" --log-level warn
python3 - "$run/generated.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert [r["prompt"] for r in rows] == ["the cat sat on", "the owl"] and all(len(r["tokens"]) == 6 for r in rows), rows
PY
if "$prefix/bin/tessera" export --checkpoint "$run/ckpt" --hf-out "$run/hf2" 2> "$run/convert.err"; then
  echo "check.sh: tessera export read a research checkpoint without the plug-in" >&2
  exit 1
fi
grep -q 'model_type is "parallel_block_lm"' "$run/convert.err" || { cat "$run/convert.err" >&2; exit 1; }
if "$prefix/bin/tessera" train --plugin "$work/no-such-plugin.so" --recipe "$src/examples/research/research.yaml" \
  2> "$run/plugin.err"; then
  echo "check.sh: a missing plug-in was accepted" >&2
  exit 1
fi
grep -q "no-such-plugin.so: no such file" "$run/plugin.err" || { cat "$run/plugin.err" >&2; exit 1; }
if "$prefix/bin/tessera" export --plugin "$src/examples/research/research.yaml" --checkpoint "$run/ckpt" --hf-out "$run/hf3" \
  2> "$run/plugin.err"; then
  echo "check.sh: a file that is not a shared library was accepted as a plug-in" >&2
  exit 1
fi
grep -q "research.yaml: cannot load: " "$run/plugin.err" || { cat "$run/plugin.err" >&2; exit 1; }

# The plug-in's model in pipeline stages, unchanged: 2 stages (1F1B) on 2 ranks give one process's losses.
for nproc in 1 2; do
  pp=(fsdp_config.sharding_strategy=NO_SHARD)  # one rank per stage: NO_SHARD (DDP) there too
  ((nproc == 1)) || pp=(--nproc-per-node 2 --master-port 0 "parallelism={pipeline_parallel_degree: 2}")
  "$prefix/bin/tessera" train --plugin "$plugin" --recipe "$src/examples/research/research.yaml" "${pp[@]}" \
    variables.data_local="$run/data" save_folder="$run/ckpt-pp$nproc" loggers.jsonl.filename="$run/pp$nproc.jsonl" \
    max_duration=4ba eval_interval=0 > "$run/pp$nproc.log" 2>&1 ||
    { cat "$run/pp$nproc.log" >&2; exit 1; }
done
python3 - "$run/pp1.jsonl" "$run/pp2.jsonl" <<'PY'
import json, sys
losses = [[json.loads(l)["loss/train/total"] for l in open(f) if "loss/train/total" in l] for f in sys.argv[1:]]
assert len(losses[0]) == 4 and len(losses[1]) == 4, losses
assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(*losses)), losses
PY

# add_subdirectory: the library and the tools are targets, the tests and benchmarks are not.
mkdir -p "$work/subdir"
cat > "$work/subdir/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(UsesTesseraAsASubdirectory LANGUAGES CXX)
add_subdirectory("$src" tessera)
CMAKE
cmake -S "$work/subdir" -B "$work/subdir/build" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" > "$work/subdir.log" 2>&1 ||
  { cat "$work/subdir.log"; exit 1; }
targets=$(cmake --build "$work/subdir/build" --target help)
for want in tessera tessera_cli train eval; do
  grep -qE "(^|[ /])$want(:| )" <<< "$targets" || { echo "check.sh: add_subdirectory has no target $want" >&2; exit 1; }
done
if grep -E "tessera_tests|bench_|embed_trainer" <<< "$targets"; then
  echo "check.sh: add_subdirectory(tessera) would build the targets above (tests, benchmarks or examples)" >&2
  exit 1
fi
echo "check.sh: installed, built out of tree, ran; the installed tools trained (in pipeline stages too)," \
  "converted, evaluated and sampled with the plug-in;" \
  "add_subdirectory builds the library and tools only"
