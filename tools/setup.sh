#!/usr/bin/env bash
# Makes a fresh Debian machine ready to build and test Tessera. Idempotent: a second run with everything present
# downloads nothing and finishes in seconds.
#
#   1. Debian packages (compiler toolchain and C++ libraries), only those missing.
#   2. A machine-wide Python venv at $TESSERA_HOME/venv (default ~/.cache/tessera/venv) holding the pinned PyPI
#      `torch` wheel, which provides LibTorch (headers, shared libraries, CMake config), plus the Python peers that
#      tests/compat/ compares against (tools/requirements.txt). It lives outside the checkout so fresh clones reuse it.
#   3. The C sources of zstd 1.5.7, from the pinned PyPI `zstd` source distribution (which bundles them), at
#      $TESSERA_HOME/src/zstd-<version>: CMake builds them into Tessera, because MDS shards must be compressed by the
#      zstd version Streaming uses to be byte-identical to its (Debian 12 has 1.5.4; docs/data.md#reading-dataset-files).
#   4. transformers 5 in a venv of its own beside the main one (tools/setup_tf5.sh), for tests/compat's
#      test_transformers5_*.py (ctest's compat_tf5 entry).
#   5. The pure-Python wheels of torchtitan's trainer (benchmarks/gpu_peer_wheels.txt) at $TESSERA_HOME/wheels, which
#      the GPU kit carries (tools/gpu_bundle.sh).
#   6. OpenAI's tiktoken ranks files (cl100k_base, p50k_base, o200k_base) in a tiktoken cache at
#      $TESSERA_HOME/tiktoken, for the tiktoken tests: taken from the pinned PyPI `litellm` wheel, which ships them
#      under tiktoken's cache names for offline use, and checked against the sha256 tiktoken expects.
#
# Environment: TESSERA_HOME (install prefix), TESSERA_PYTHON (interpreter that creates the venv; default python3).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TESSERA_HOME=${TESSERA_HOME:-$HOME/.cache/tessera}
venv="$TESSERA_HOME/venv"
log() { printf '[setup] %s\n' "$*"; }

# ---- 1. Debian packages ------------------------------------------------------------------------------------------
apt_packages=(
  build-essential cmake ninja-build ccache pkg-config git clang-format xz-utils
  clang clang-tidy libclang-rt-dev
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcurl4-openssl-dev libssl-dev libzstd-dev libxxhash-dev zlib1g-dev libpcre2-dev libicu-dev libgloo-dev coinor-libcbc-dev
  python3 python3-venv python3-dev
  fortunes jq unzip
  iproute2  # `ip netns` for the PyTorchJob test (tests/compat/test_launchers.py)
  slurmctld slurmd slurm-client munge  # a one-node Slurm cluster for the Slurm test (tests/compat/test_launchers.py)
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  log "Debian packages: all present"
fi

# ---- 2. Python venv with LibTorch and the compatibility peers ---------------------------------------------------
req="$here/requirements.txt"
stamp="$venv/.tessera-requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  log "venv $venv: up to date"
else
  python=${TESSERA_PYTHON:-python3}
  if [ ! -x "$venv/bin/python" ]; then
    log "creating venv $venv with $($python --version)"
    mkdir -p "$TESSERA_HOME"
    "$python" -m venv "$venv"
  fi
  log "installing pinned Python packages from $req (LibTorch comes from the torch wheel; this takes a few minutes)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi

torch_cmake=$("$venv/bin/python" - <<'PY'
import glob, os, sys
# Avoid `import torch` (slow); the wheel's CMake package sits at a fixed place inside site-packages.
hits = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "torch", "share", "cmake", "Torch"))
print(hits[0] if hits else "")
PY
)
[ -n "$torch_cmake" ] || { echo "[setup] error: torch CMake package not found in $venv" >&2; exit 1; }
log "LibTorch CMake package: $torch_cmake"

# ---- 3. zstd sources ------------------------------------------------------------------------------------------------
zstd_version=1.5.7.2
zstd_sha256=6d8684c69009be49e1b18ec251a5eb0d7e24f93624990a8a124a1da66a92fc8a
zstd_dir="$TESSERA_HOME/src/zstd-$zstd_version"
if [ -f "$zstd_dir/zstd/lib/zstd.h" ]; then
  log "zstd sources $zstd_dir: present"
else
  tmp=$(mktemp -d)
  log "fetching the zstd $zstd_version source distribution from PyPI"
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "zstd==$zstd_version" -d "$tmp"
  echo "$zstd_sha256  $tmp/zstd-$zstd_version.tar.gz" | sha256sum -c --quiet - \
    || { echo "[setup] error: zstd-$zstd_version.tar.gz does not have the pinned sha256" >&2; exit 1; }
  mkdir -p "$TESSERA_HOME/src"
  tar -xzf "$tmp/zstd-$zstd_version.tar.gz" -C "$tmp"
  rm -rf "$zstd_dir" && mv "$tmp/zstd-$zstd_version" "$zstd_dir"
  rm -rf "$tmp"
  log "zstd sources: $zstd_dir"
fi
# ---- 4. transformers 5 -----------------------------------------------------------------------------------------------
TESSERA_HOME="$TESSERA_HOME" "$here/setup_tf5.sh"

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
      || { echo "[setup] error: tiktoken file $name does not have the sha256 tiktoken expects" >&2; exit 1; }
    mv "$tmp/files/$name" "$tiktoken_cache/$name"
  done
  rm -rf "$tmp"
  log "tiktoken encodings: $tiktoken_cache"
fi
log "ready"
