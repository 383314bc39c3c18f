# Sourced by tools/setup.sh and tools/setup_tests.sh (each defines `log` first).

# apt_install_missing PACKAGE...: installs those of the Debian packages that are not installed (with sudo unless
# root), showing apt's progress; says so when all are present.
apt_install_missing() {
  local missing=() p sudo=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    log "Debian packages: all present"
    return
  fi
  log "installing Debian packages: ${missing[*]}"
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}
