#!/usr/bin/env bash
# Makes a fresh Debian machine ready to build and test Tessera. Idempotent: a second run with everything present
# downloads nothing and finishes in seconds.
#
#   1. Debian packages (compiler toolchain and C++ libraries), only those missing.
#   2. A machine-wide Python venv at $TESSERA_HOME/venv (default ~/.cache/tessera/venv) holding the pinned PyPI
#      `torch` wheel, which provides LibTorch (headers, shared libraries, CMake config), plus the Python peers that
#      tests/compat/ compares against (tools/requirements.txt). It lives outside the checkout so fresh clones reuse it.
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
  fortunes jq
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
log "ready"
