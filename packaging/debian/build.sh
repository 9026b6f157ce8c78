#!/usr/bin/env bash
# Builds steadfast's two Debian packages with dpkg-deb:
#   steadfast-agent (this arch)  the node agent alone, for GPU nodes: the bundled agent
#                           (scripts/stage-agent.mjs) in /usr/lib/steadfast-agent with its one npm
#                           dependency, koffi, and koffi's glibc binary for this architecture (the
#                           FFI library NVML is read through), the steadfast-agent command, the
#                           agent unit, /etc/steadfast/agent.env and the Slurm prolog
#   steadfast (this arch)   the controller and the full command line: the npm package with its
#                           production dependencies in /usr/lib/steadfast, the steadfast command,
#                           the controller unit, /etc/steadfast/controller.{env,yaml}
# Both may be installed on one machine; no file is in both. The version is the top entry of
# packaging/debian/changelog, whose upstream part must be package.json's version.
# Usage: packaging/debian/build.sh [--out DIR] [--no-build]
#   --out DIR    where to write the .deb files (default: the current directory)
#   --no-build   pack the dist/ already built instead of running `npm run build` first
# Prints the paths of the two .deb files, one per line, as its last lines.
# npm dependencies come from the npm cache first (--prefer-offline), the registry for what it lacks.
set -euo pipefail
umask 022

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
upstream=$(node -p 'require("./package.json").version')
version=$(dpkg-parsechangelog -l "$here/changelog" -S Version)
if [ "${version%-*}" != "$upstream" ]; then
  echo "build.sh: packaging/debian/changelog is at $version, package.json at $upstream: add a changelog entry (dch -v $upstream-1)" >&2
  exit 1
fi
# The changelog's date, not the clock: the same tree builds the same packages.
changelog_date=$(dpkg-parsechangelog -l "$here/changelog" -S Date)
man_date=$(date -u -d "$changelog_date" '+%B %Y')
arch=$(dpkg --print-architecture)
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || true)

stage=$(mktemp -d "${TMPDIR:-/tmp}/steadfast-deb-XXXXXX")
trap 'rm -rf "$stage"' EXIT

if [ "$build" -eq 1 ]; then npm run --silent build; fi
for built in dist/cli/main.js dist/agent.cjs dist/agent-loader.cjs dist/nvml-worker.cjs; do
  [ -f "$built" ] || { echo "build.sh: $built is missing: run npm run build, or drop --no-build" >&2; exit 1; }
done

# What every package has: its copyright file, changelog, manual page, lintian overrides and docs.
# Arguments: the package, its root, then the docs to install.
add_docs() {
  local package=$1 root=$2
  shift 2
  local doc=$root/usr/share/doc/$package
  install -d "$doc" "$root/usr/share/man/man1"
  gzip -9n <"$here/changelog" >"$doc/changelog.Debian.gz"
  sed -e "s/@VERSION@/$upstream/" -e "s/@DATE@/$man_date/" "$here/$package/$package.1" | gzip -9n >"$root/usr/share/man/man1/$package.1.gz"
  if [ -f "$here/$package/lintian-overrides" ]; then
    install -D -m 0644 "$here/$package/lintian-overrides" "$root/usr/share/lintian/overrides/$package"
  fi
  local file
  for file in "$@"; do [ ! -f "$file" ] || install -m 0644 "$file" "$doc/"; done
}

# The control area: the maintainer scripts in packaging/debian/PACKAGE/, conffiles (every file
# under /etc), md5sums, and the control file from stdin with Installed-Size added.
finish() {
  local package=$1 root=$2 deb_arch=$3
  install -d "$root/DEBIAN"
  local script
  for script in postinst prerm postrm; do install -m 0755 "$here/$package/$script" "$root/DEBIAN/"; done
  if [ -f "$here/$package/triggers" ]; then install -m 0644 "$here/$package/triggers" "$root/DEBIAN/"; fi
  (cd "$root" && find etc -type f -printf '/%p\n' | sort) >"$root/DEBIAN/conffiles"
  (cd "$root" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
  {
    cat
    echo "Installed-Size: $(du -sk --apparent-size --exclude=DEBIAN "$root" | cut -f1)"
  } >"$root/DEBIAN/control"
  local deb=$out/${package}_${version}_${deb_arch}.deb
  dpkg-deb --root-owner-group -Zgzip --build "$root" "$deb" >/dev/null
  debs+=("$deb")
}

# The npm trees are pruned to what this machine's Node.js loads (packaging/prune-node-modules.sh:
# no tests, docs or sources; of the native objects only this machine's glibc builds, stripped).
prune_node_modules() { "$repo/packaging/prune-node-modules.sh" "$1"; }

# dpkg-shlibdeps' Depends for native objects (it wants a debian/control to read; any will do).
shlib_depends() {
  local work=$stage/shlibdeps
  install -d "$work/debian"
  printf 'Source: steadfast\n\nPackage: steadfast\nArchitecture: any\n' >"$work/debian/control"
  (cd "$work" && dpkg-shlibdeps -O "$@" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}

debs=()

# ---- steadfast-agent ------------------------------------------------------------------------
agent=$stage/steadfast-agent
node scripts/stage-agent.mjs "$stage/agent-tree" >/dev/null
install -d "$agent/usr/lib" "$agent/usr/bin" "$agent/usr/lib/systemd/system" "$agent/etc/steadfast"
mv "$stage/agent-tree" "$agent/usr/lib/steadfast-agent"
agent_readme=$stage/README.md
mv "$agent/usr/lib/steadfast-agent/README.md" "$agent_readme"
if [ -n "$revision" ] && [ ! -f "$agent/usr/lib/steadfast-agent/REVISION" ]; then printf '%s\n' "$revision" >"$agent/usr/lib/steadfast-agent/REVISION"; fi
# STEADFAST_NODE_FLAGS: Node.js options for node (agent.env's), which NODE_OPTIONS does not all accept.
cat >"$agent/usr/bin/steadfast-agent" <<'WRAPPER'
#!/bin/sh
# shellcheck disable=SC2086 # the flags are words on purpose
exec node ${STEADFAST_NODE_FLAGS:-} /usr/lib/steadfast-agent/bin/steadfast-agent.cjs "$@"
WRAPPER
chmod 0755 "$agent/usr/bin/steadfast-agent"
# The Slurm preflight (docs/deploy-slurm.md): slurm.conf's Prolog= names it where it is installed.
install -D -m 0755 deploy/slurm/prolog.sh "$agent/usr/lib/steadfast-agent/slurm/prolog.sh"
install -m 0644 deploy/systemd/steadfast-agent.service "$agent/usr/lib/systemd/system/"
install -m 0644 "$here/etc/agent.env" "$agent/etc/steadfast/"
add_docs steadfast-agent "$agent" "$agent_readme" docs/agent.md docs/install-debian.md docs/deploy-slurm.md
# koffi, as stage-agent.mjs copied it from node_modules: this machine's glibc binary alone stays.
prune_node_modules "$agent/usr/lib/steadfast-agent/node_modules"
node "$here/copyright.mjs" --node-modules "usr/lib/steadfast-agent/node_modules=$agent/usr/lib/steadfast-agent/node_modules" \
  --bundle usr/lib/steadfast-agent/dist/agent.cjs=dist/cli/agent-main.js >"$agent/usr/share/doc/steadfast-agent/copyright"
mapfile -d '' objects < <(find "$agent/usr/lib/steadfast-agent" -type f -name '*.node' -print0)
[ ${#objects[@]} -gt 0 ] || { echo "build.sh: no koffi binary for $arch in node_modules (npm ci installs this machine's)" >&2; exit 1; }
agent_shlibs=$(shlib_depends "${objects[@]}")
finish steadfast-agent "$agent" "$arch" <<CONTROL
Package: steadfast-agent
Version: $version
Architecture: $arch
Maintainer: steadfast maintainers <maintainers@steadfast.dev>
Depends: nodejs (>= 20.10), adduser${agent_shlibs:+, $agent_shlibs}
Section: admin
Priority: optional
Description: GPU node agent of steadfast, which keeps LLM training jobs running
 A Prometheus exporter for GPU nodes: GPU health from NVIDIA's management
 library (NVML, in-process), nvidia-smi or dcgm-exporter, NVIDIA Xid errors
 and host kernel events from the kernel log, InfiniBand and RoCE ports, NFS
 client statistics, training progress and the training process tree.
 Fatal faults (a fatal Xid, a lost GPU, a failed training worker) go
 straight to the steadfast controller, which drains the node or recovers
 the job; the agent also takes stack dumps and runs stop-time diagnostics
 when the controller asks.
 .
 This package holds the agent alone, one bundled script run by Node.js with
 koffi, the FFI library it reads NVML through, its systemd unit and the
 Slurm prolog that checks a node before each job. The controller is in the
 package steadfast.
CONTROL

# ---- steadfast --------------------------------------------------------------------------------
controller=$stage/steadfast
lib=$controller/usr/lib/steadfast
npm pack --ignore-scripts --silent --pack-destination "$stage" >/dev/null
npm install --global --prefix "$stage/npm" --prefer-offline --omit=dev --no-audit --no-fund --loglevel=error "$stage/steadfast-$upstream.tgz" >/dev/null
install -d "$controller/usr/lib" "$controller/usr/bin" "$controller/usr/lib/systemd/system" "$controller/etc/steadfast"
mv "$stage/npm/lib/node_modules/steadfast" "$lib"
# steadfast_build_info's revision label: the commit built, when built from a git checkout.
if [ -n "$revision" ]; then printf '%s\n' "$revision" >"$lib/REVISION"; fi
# Not for /usr/lib: the README (a doc), the units and the prolog (installed where systemd and the
# agent's package want them) and a V8 code cache (each node makes its own).
controller_readme=$stage/steadfast-README.md
mv "$lib/README.md" "$controller_readme"
rm -rf "$lib/deploy" "$lib/dist/agent.cjs.cache"
prune_node_modules "$lib/node_modules"
cat >"$controller/usr/bin/steadfast" <<'WRAPPER'
#!/bin/sh
# STEADFAST_NODE_FLAGS: Node.js options for node, which NODE_OPTIONS does not all accept.
# shellcheck disable=SC2086 # the flags are words on purpose
exec node ${STEADFAST_NODE_FLAGS:-} /usr/lib/steadfast/bin/steadfast.js "$@"
WRAPPER
chmod 0755 "$controller/usr/bin/steadfast"
install -m 0644 deploy/systemd/steadfast-controller.service "$controller/usr/lib/systemd/system/"
install -m 0644 "$here/etc/controller.env" "$here/etc/controller.yaml" "$controller/etc/steadfast/"
add_docs steadfast "$controller" "$controller_readme" docs/install.md docs/install-debian.md docs/configuration.md docs/security.md
node "$here/copyright.mjs" --node-modules "usr/lib/steadfast/node_modules=$lib/node_modules" --bundle usr/lib/steadfast/dist/agent.cjs=dist/cli/agent-main.js >"$controller/usr/share/doc/steadfast/copyright"
mapfile -d '' objects < <(find "$lib" -type f -name '*.node' -print0)
shlibs=''
if [ ${#objects[@]} -gt 0 ]; then shlibs=$(shlib_depends "${objects[@]}"); fi
finish steadfast "$controller" "$arch" <<CONTROL
Package: steadfast
Version: $version
Architecture: $arch
Maintainer: steadfast maintainers <maintainers@steadfast.dev>
Depends: nodejs (>= 20.10), adduser${shlibs:+, $shlibs}
Recommends: redis-server
Suggests: steadfast-agent, slurm-client
Section: admin
Priority: optional
Description: keeps large LLM training jobs running: controller and command line
 steadfast turns GPU node faults into decisions. A node outside any
 registered training job that loses a GPU or logs a fatal Xid is drained
 once; a registered job climbs a recovery ladder (evict onto a warm standby,
 diagnose, reattempt, roll the code back, replay) before a person is called.
 Faults come from the steadfast agents' fast path and from Alertmanager;
 drains go through Slurm or Kubernetes, behind a pause switch, budgets and
 node leases. Every signal, decision and action is written to an audit trail
 in Redis.
 .
 This package holds the controller, its systemd unit and configuration, and
 the steadfast command line (rules, dashboards, Alertmanager configuration,
 operator commands). The GPU node agent is in the package steadfast-agent.
CONTROL

printf '%s\n' "${debs[@]}"
