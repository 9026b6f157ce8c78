#!/usr/bin/env bash
# Builds the steadfast Debian package with dpkg-deb:
#   /usr/lib/steadfast        the npm package, installed with its production dependencies
#   /usr/bin/steadfast        a wrapper that runs it with the system's node
#   /lib/systemd/system       steadfast-agent.service, steadfast-controller.service
#   /etc/steadfast            agent.env, controller.env, controller.yaml (conffiles)
# Usage: packaging/debian/build.sh [--out DIR] [--no-build]
#   --out DIR    where to write steadfast_VERSION_ARCH.deb (default: the current directory)
#   --no-build   pack the dist/ already built instead of running `npm run build` first
# Dependencies come from the npm cache first (--prefer-offline), the registry for what it lacks.
set -euo pipefail

out=$PWD
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "build.sh: --out needs a directory" >&2; exit 2; }; out=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "build.sh: unknown argument '$1' (expected --out DIR or --no-build)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
version=$(node -p 'require("./package.json").version')
arch=$(dpkg --print-architecture)

stage=$(mktemp -d "${TMPDIR:-/tmp}/steadfast-deb-XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/root

if [ "$build" -eq 1 ]; then npm run --silent build; fi
[ -f dist/cli/main.js ] || { echo "build.sh: dist/ is missing: run npm run build, or drop --no-build" >&2; exit 1; }
npm pack --ignore-scripts --silent --pack-destination "$stage" >/dev/null
npm install --global --prefix "$stage/npm" --prefer-offline --omit=dev --no-audit --no-fund --loglevel=error "$stage/steadfast-$version.tgz"

install -d "$root/usr/lib" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/steadfast" "$root/usr/share/doc/steadfast" "$root/DEBIAN"
mv "$stage/npm/lib/node_modules/steadfast" "$root/usr/lib/steadfast"
# steadfast_build_info's revision label: the commit built, when built from a git checkout.
if revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null); then printf '%s\n' "$revision" >"$root/usr/lib/steadfast/REVISION"; fi
# The wrapper finds the tree relative to itself, so an unpacked copy (dpkg -x) runs too.
# STEADFAST_NODE_FLAGS: V8 flags for node (the agent unit's), which NODE_OPTIONS does not accept.
cat >"$root/usr/bin/steadfast" <<'WRAPPER'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
# shellcheck disable=SC2086 # the flags are words on purpose
exec node ${STEADFAST_NODE_FLAGS:-} "$here/../lib/steadfast/bin/steadfast.js" "$@"
WRAPPER
chmod 0755 "$root/usr/bin/steadfast"
# The Slurm preflight (docs/deploy-slurm.md): slurm.conf's Prolog= names it where it is installed.
install -D -m 0755 deploy/slurm/prolog.sh "$root/usr/lib/steadfast/slurm/prolog.sh"
install -m 0644 deploy/systemd/steadfast-agent.service deploy/systemd/steadfast-controller.service "$root/lib/systemd/system/"
install -m 0644 "$here/etc/agent.env" "$here/etc/controller.env" "$here/etc/controller.yaml" "$root/etc/steadfast/"
install -m 0644 docs/install.md docs/configuration.md docs/agent.md docs/security.md "$root/usr/share/doc/steadfast/"

installed_kb=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: steadfast
Version: $version
Architecture: $arch
Maintainer: steadfast maintainers <steadfast@localhost>
Depends: nodejs (>= 20), adduser
Recommends: prometheus-node-exporter
Suggests: redis-server, slurm-client
Section: admin
Priority: optional
Installed-Size: $installed_kb
Description: keeps large LLM training jobs running
 GPU-node agent (a Prometheus exporter for GPU, Xid, InfiniBand and NFS
 health, with a fast path of fatal events) and the controller that turns
 alerts into training-level recovery through Slurm or Kubernetes.
CONTROL
printf '/etc/steadfast/agent.env\n/etc/steadfast/controller.env\n/etc/steadfast/controller.yaml\n' >"$root/DEBIAN/conffiles"
install -m 0755 "$here/postinst" "$here/prerm" "$here/postrm" "$root/DEBIAN/"

deb=$out/steadfast_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zgzip --build "$root" "$deb" >/dev/null
echo "$deb"
