#!/usr/bin/env bash
# Install the Debian packages pcrfs needs, only those missing; `apt-get update` runs at most once.
set -euo pipefail
# Profiles: --demo is what `make demo` and `make wheel` need (FUSE, libjpeg, a compiler);
# the default adds the test stack, --bench the bench's too.  Extra args: packages a target
# needs (fuzz: clang).
demo=(fuse3 libfuse3-dev libxxhash-dev pkg-config libjpeg62-turbo-dev libjpeg-turbo-progs gcc make)
profile=test
case "${1:-}" in --demo|--bench) profile=${1#--}; shift ;; esac
if [ "$profile" = demo ]; then
  pkgs=("${demo[@]}" "$@")
else
  # nginx-light: http:// dataset tests; prometheus: the metrics tests scrape a live mount;
  # memcached: the peer cache of --shard mounts (pcrfs/storage/peers.py); tini: the CSI
  # plugin's init, as in deploy/Dockerfile
  pkgs=("${demo[@]}" attr g++ mount util-linux systemd nginx-light prometheus memcached curl tini "$@")
  # iproute2: tc, the one bandwidth limit of bench/peers.py's S3 regimes; libopencv-dev and
  # libturbojpeg0-dev: FFCV's sdist builds against them (the peers' environment)
  if [ "$profile" = bench ]; then pkgs+=(iproute2 libopencv-dev libturbojpeg0-dev); fi
  # npm installs Azurite (the az:// tests' emulator); a Node.js from elsewhere (nodesource)
  # brings its own npm, and Debian's npm would conflict with it
  if ! command -v npm >/dev/null 2>&1; then pkgs+=(nodejs npm); fi
fi
py=${PYTHON:-python3.11}
# A Python without venv or headers (Debian's own) needs its -venv/-dev packages.
if ! "$py" -c 'import venv, ensurepip, sysconfig, os; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then
  pkgs+=(python3-venv python3-dev)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then echo "system packages: all present"; exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2; exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# the tests start their own nginx, prometheus and memcached: the packages' services, which
# Debian enables and starts at install, are switched off again, for those installed now only
for svc in nginx prometheus memcached; do
  case " ${missing[*]} " in *" $svc "*|*" $svc-light "*) ;; *) continue ;; esac
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now "$svc" >/dev/null 2>&1 && echo "disabled the $svc service the package enabled"
  fi
done
