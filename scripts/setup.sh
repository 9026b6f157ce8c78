#!/usr/bin/env bash
# Prepares a machine for steadfast's demo and tests: the Debian packages of the real parts
# (installed only when missing), the npm packages (from package-lock.json), and the build.
# Safe to run again; it does only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
# Redis Sentinel (the failover test, tryit/redis-ha.ts) runs as `redis-server --sentinel`: Debian's
# redis-sentinel package adds only a service for it, so redis-server suffices.
command -v prometheus >/dev/null || need+=(prometheus)
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v amtool >/dev/null || need+=(prometheus-alertmanager)
command -v prometheus-node-exporter >/dev/null || need+=(prometheus-node-exporter)  # bench baseline
# The Debian package test verifies the systemd units (systemd-analyze) of the .debs it builds.
command -v systemd-analyze >/dev/null || need+=(systemd)
# packaging/debian/build.sh (dpkg-parsechangelog, dpkg-shlibdeps; strip and readelf for the
# controller's native objects) and its test: lintian, and a Debian root to install into.
command -v dpkg-parsechangelog >/dev/null || need+=(dpkg-dev)
command -v dpkg-shlibdeps >/dev/null || need+=(dpkg-dev)
command -v strip >/dev/null || need+=(binutils)
command -v readelf >/dev/null || need+=(binutils)
command -v lintian >/dev/null || need+=(lintian)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v scontrol >/dev/null || need+=(slurm-client)
command -v sinfo >/dev/null || need+=(slurm-client)
command -v slurmrestd >/dev/null || need+=(slurmrestd)
# `steadfast lab` (docs/lab.md): a real slurmd per node namespace, made with ip, nsenter, unshare.
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
[ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
# The lab's example training (examples/pytorch): Debian's PyTorch, run with /usr/bin/python3.
[ -x /usr/bin/python3 ] || need+=(python3)
[ -e /usr/lib/python3/dist-packages/torch/__init__.py ] || need+=(python3-torch)
# The sim's slurmctld accepts JWTs (scontrol token, slurmrestd) besides auth/none.
compgen -G '/usr/lib/*/slurm-wlm/auth_jwt.so' >/dev/null || need+=(slurm-wlm-jwt-plugin)
if [ ! -e /usr/sbin/munged ] && ! command -v munged >/dev/null; then need+=(munge); fi
# The container images (packaging/image/build.sh, test/package/image.test.ts): a Debian root by
# mmdebstrap, the OCI archives by buildah.
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v buildah >/dev/null || need+=(buildah)
# The stand-in libnvidia-ml.so.1 (tryit/nvml/stand-in.c) that the NVML tests and the packaging tests
# read through koffi: built with cc (gcc) against glibc's headers.
command -v cc >/dev/null || need+=(gcc)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
# The ETTR plot's PNG draws its text with an installed font (tryit/ettr/plot.ts, docs/ettr-plot.md).
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)

if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  echo "steadfast setup: installing Debian packages: ${need[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  # --no-install-recommends keeps Grafana-less prometheus installs small; policy-rc.d stops
  # the packages' own services from starting on the default ports.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${sudo_cmd[@]}" chmod +x /usr/sbin/policy-rc.d
    trap '"${sudo_cmd[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# npm packages: install when missing or when the lock file changed since the last install.
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "steadfast setup: installing npm packages (versions pinned by package-lock.json)"
  # npm ci installs exactly what the lock file says, and fails (naming the package) when the lock
  # file and package.json disagree, rather than rewriting the lock file as npm install would.
  npm ci --no-audit --no-fund --loglevel=error
fi

echo "steadfast setup: building"
# The product (what the packages carry), then the benchmarks beside it (dist/bench/, which the
# benchmark tests run); the tests themselves run from source.
npm run --silent build
npm run --silent build:bench
