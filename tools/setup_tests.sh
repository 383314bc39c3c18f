#!/usr/bin/env bash
# Everything README's test command (b) needs beyond tools/setup.sh (which this runs first): the test suite's peers and
# tools. Idempotent: a second run with everything present downloads nothing and finishes in seconds.
#
#   1. Debian packages: clang, clang-tidy, libFuzzer's runtime and clang-format (the deep tier and the style check),
#      GoogleTest and Google Benchmark, python3-dev, unzip and xz-utils, iproute2 (`ip netns` for the PyTorchJob test)
#      and a one-node Slurm cluster with munge (tests/compat/test_launchers.py); only those missing.
#   2. The real peers that tests/compat/ compares against (tools/requirements-test.txt: transformers, tokenizers,
#      peft, Streaming, boto3 and moto's S3 server, MLflow, wandb, tiktoken, ...) in the same venv as LibTorch.
#   3. transformers 5 in a venv of its own beside it (tools/setup_tf5.sh), for tests/compat's test_transformers5_*.py
#      (ctest's compat_tf5 entry).
#   4. Composer + LLM Foundry in a venv of their own (tools/setup_composer.sh), for tests/composer/ (ctest's
#      composer entry) and the benchmarks that measure them.
#   5. The pure-Python wheels of torchtitan's trainer (benchmarks/gpu_peer_wheels.txt) at $TESSERA_HOME/wheels, which
#      the GPU kit carries (tools/gpu_bundle.sh).
#   6. OpenAI's tiktoken ranks files (cl100k_base, p50k_base, o200k_base) in a tiktoken cache at
#      $TESSERA_HOME/tiktoken, for the tiktoken tests: taken from the pinned PyPI `litellm` wheel, which ships them
#      under tiktoken's cache names for offline use, and checked against the sha256 tiktoken expects.
#
# About 10 GB more than tools/setup.sh (the peers 2.3 GB, Composer's venv with its own torch 7 GB, transformers 5 and
# the wheels the rest). Environment: TESSERA_HOME, TESSERA_PYTHON (as tools/setup.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TESSERA_HOME=${TESSERA_HOME:-$HOME/.cache/tessera}
export TESSERA_HOME
venv="$TESSERA_HOME/venv"
log() { printf '[setup-tests] %s\n' "$*"; }
# shellcheck source=tools/setup_common.sh
source "$here/setup_common.sh"

"$here/setup.sh"

# ---- 1. Debian packages ------------------------------------------------------------------------------------------
apt_packages=(
  clang clang-tidy libclang-rt-dev clang-format
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-dev unzip xz-utils
  iproute2  # `ip netns` for the PyTorchJob test (tests/compat/test_launchers.py)
  slurmctld slurmd slurm-client munge  # a one-node Slurm cluster for the Slurm test (tests/compat/test_launchers.py)
)
apt_install_missing "${apt_packages[@]}"

# ---- 2. The peers, in the main venv -------------------------------------------------------------------------------
stamp="$venv/.tessera-test-requirements.sha256"
want=$(cat "$here/requirements.txt" "$here/requirements-test.txt" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "test peers in $venv: up to date"
else
  log "installing the test peers from $here/requirements-test.txt into $venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on -r "$here/requirements-test.txt"
  echo "$want" > "$stamp"
fi

# ---- 3. transformers 5 ----------------------------------------------------------------------------------------------
"$here/setup_tf5.sh"

# ---- 4. Composer + LLM Foundry ------------------------------------------------------------------------------------
"$here/setup_composer.sh"

# ---- 5. The GPU kit's peer wheels ----------------------------------------------------------------------------------
# torchtitan and its pure-Python dependencies, which tools/gpu_bundle.sh packs into the kit (the GPU machine is offline).
peer_wheels="$here/../benchmarks/gpu_peer_wheels.txt"
wheels="$TESSERA_HOME/wheels"
want=$(sha256sum "$peer_wheels" | cut -d' ' -f1)
if [ -f "$wheels/.tessera-wheels.sha256" ] && [ "$(cat "$wheels/.tessera-wheels.sha256")" = "$want" ]; then
  log "GPU kit wheels $wheels: present"
else
  rm -rf "$wheels" && mkdir -p "$wheels"
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
    -r "$peer_wheels" -d "$wheels"
  echo "$want" > "$wheels/.tessera-wheels.sha256"
  log "GPU kit wheels: $wheels ($(ls "$wheels"/*.whl | wc -l) wheels)"
fi

# ---- 6. tiktoken's encodings ------------------------------------------------------------------------------------------
tiktoken_cache="$TESSERA_HOME/tiktoken"
# tiktoken's cache name (sha1 of the URL) and expected sha256 of cl100k_base, p50k_base and o200k_base.
tiktoken_files=(
  "9b5ad71b2ce5302211f9c61530b329a4922fc6a4 223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
  "ec7223a39ce59f226a68acc30dc1af2788490e15 94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069"
  "fb374d419588a4632f3f557e76b4b70aebbca790 446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
)
tiktoken_ok=1
for f in "${tiktoken_files[@]}"; do
  [ -f "$tiktoken_cache/${f%% *}" ] || tiktoken_ok=0
done
if [ "$tiktoken_ok" = 1 ]; then
  log "tiktoken encodings $tiktoken_cache: present"
else
  tmp=$(mktemp -d)
  log "fetching tiktoken's cl100k_base, p50k_base and o200k_base from the litellm wheel on PyPI"
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
    "litellm==1.110.2" -d "$tmp"
  mkdir -p "$tiktoken_cache"
  for f in "${tiktoken_files[@]}"; do
    name=${f%% *}
    unzip -q -o -j "$tmp"/litellm-*.whl "litellm/litellm_core_utils/tokenizers/$name" -d "$tmp/files"
    echo "${f##* }  $tmp/files/$name" | sha256sum -c --quiet - \
      || { echo "[setup-tests] error: tiktoken file $name does not have the sha256 tiktoken expects" >&2; exit 1; }
    mv "$tmp/files/$name" "$tiktoken_cache/$name"
  done
  rm -rf "$tmp"
  log "tiktoken encodings: $tiktoken_cache"
fi
log "ready: tools/test.sh"
