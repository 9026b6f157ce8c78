#!/usr/bin/env bash
# Builds the steadfast container images with buildah, from Debian's archive, into OCI archives:
#   steadfast-agent-VERSION.oci.tar       Node.js from Debian and the agent alone
#                                         (/usr/lib/steadfast-agent, scripts/stage-agent.mjs) with
#                                         koffi and its glibc binary for this architecture (NVML
#                                         in-process), V8's code cache its own node made; user 65532
#   steadfast-controller-VERSION.oci.tar  Node.js from Debian and the npm package with its
#                                         production dependencies (/usr/lib/steadfast); user 65532
# Both have two layers: the Node.js runtime (runtime-root.sh: node, its libraries, CA
# certificates; no shell, no package manager), shared by the two, then the application.
# Usage: packaging/image/build.sh [--out DIR] [--no-build] [--only agent|controller]
#   --out DIR     where to write the archives (default: the current directory)
#   --no-build    use the dist/ already built instead of running `npm run build` first
#   --only WHICH  build one image
# Prints the path of each archive written. Needs root, buildah, binutils (the agent's koffi binary
# is stripped, packaging/prune-node-modules.sh), mmdebstrap (the Debian root
# comes from scripts/debian-root.sh, cached under ${TMPDIR:-/tmp}/steadfast-debian-roots) and
# npm (the controller's dependencies, from the npm cache first). Nothing is left in buildah's
# storage: it lives in a temporary directory, removed at exit.
# Environment: STEADFAST_IMAGE_SUITE (default trixie: Node.js 20.19; bookworm's 18 is too old),
# SOURCE_DATE_EPOCH (the images' creation time; default: the commit's time).
set -euo pipefail

out=$PWD
build=1
only=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "build.sh: --out needs a directory" >&2; exit 2; }; out=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --only) [ $# -ge 2 ] && { [ "$2" = agent ] || [ "$2" = controller ]; } || { echo "build.sh: --only takes agent or controller" >&2; exit 2; }; only=$2; shift 2 ;;
    *) echo "build.sh: unknown argument '$1' (expected --out DIR, --no-build or --only agent|controller)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "build.sh: run as root (the Debian root, the chroot that writes the code cache, buildah's storage)" >&2; exit 1; }
command -v buildah >/dev/null || { echo "build.sh: buildah is missing: apt-get install buildah" >&2; exit 1; }
command -v strip >/dev/null && command -v readelf >/dev/null || { echo "build.sh: strip and readelf are missing: apt-get install binutils" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
[ -x scripts/debian-root.sh ] || { echo "build.sh: scripts/debian-root.sh is missing" >&2; exit 1; }
version=$(node -p 'require("./package.json").version')
suite=${STEADFAST_IMAGE_SUITE:-trixie}
revision=$(git rev-parse HEAD 2>/dev/null || true)
created=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

stage=$(mktemp -d "${TMPDIR:-/tmp}/steadfast-image-XXXXXX")
buildah_() { buildah --root "$stage/storage" --runroot "$stage/run" --storage-driver vfs "$@"; }
cleanup() {
  # Containers first, then the storage they live in.
  buildah_ rm --all >/dev/null 2>&1 || true
  rm -rf "$stage"
}
trap cleanup EXIT
# chroot isolation: buildah runs nothing here, but it must not look for a container runtime either.
export BUILDAH_ISOLATION=chroot

if [ "$build" -eq 1 ]; then npm run --silent build; fi
[ -f dist/agent.cjs ] && [ -f dist/cli/main.js ] || { echo "build.sh: dist/ is missing: run npm run build, or drop --no-build" >&2; exit 1; }

# Debian's nodejs and CA certificates, extracted without their maintainer scripts: nothing of
# Debian's runs, and nothing but their files is taken (runtime-root.sh picks from them).
DEBIAN_ROOT_VARIANT=extract scripts/debian-root.sh "$suite" "$stage/debian" nodejs ca-certificates
"$here/runtime-root.sh" "$stage/debian" "$stage/runtime"
node_version=$(chroot "$stage/runtime" /usr/bin/node --version)

labels=(
  --label "org.opencontainers.image.version=$version"
  --label "org.opencontainers.image.licenses=Apache-2.0"
  --label "org.opencontainers.image.base.name=debian:$suite nodejs $node_version"
)
[ -n "$revision" ] && labels+=(--label "org.opencontainers.image.revision=$revision")

# The shared first layer: the Node.js runtime.
runtime=$(buildah_ from scratch)
cp -a "$stage/runtime/." "$(buildah_ mount "$runtime")/"
buildah_ umount "$runtime" >/dev/null
buildah_ config --created-by "packaging/image/runtime-root.sh (Debian $suite nodejs $node_version)" "$runtime"
buildah_ commit --quiet --rm --timestamp "$created" "$runtime" steadfast-node-runtime >/dev/null

# commit IMAGE-CONTAINER NAME: writes NAME-VERSION.oci.tar (gzip layers, as a registry keeps them).
commit() {
  local archive=$out/$2-$version.oci.tar
  rm -f "$archive"
  buildah_ commit --quiet --rm --timestamp "$created" --disable-compression=false "$1" "oci-archive:$archive:$2:$version" >/dev/null
  echo "$archive"
}

if [ "$only" != controller ]; then
  # The agent tree with koffi (this machine's glibc binary alone, stripped: the image's node is
  # Debian's), then V8's code cache for it, made by the image's own node in a chroot of the
  # image's root as it will be (the cache is only read by the build that made it: cli/agent-bundle.ts).
  root=$stage/agent-root
  cp -a "$stage/runtime" "$root"
  node scripts/stage-agent.mjs "$root/usr/lib/steadfast-agent" >/dev/null
  packaging/prune-node-modules.sh "$root/usr/lib/steadfast-agent/node_modules"
  chown -R 0:0 "$root/usr/lib/steadfast-agent"
  # koffi's binary must load with the runtime layer's libraries alone (libstdc++, libgcc_s, libc).
  chroot "$root" /usr/bin/node -e 'require("/usr/lib/steadfast-agent/node_modules/koffi")'
  install -d -m 0755 "$root/var/cache/steadfast-agent"
  chroot "$root" /usr/bin/node /usr/lib/steadfast-agent/bin/steadfast-agent.cjs --write-code-cache >/dev/null
  agent=$(buildah_ from steadfast-node-runtime)
  mounted=$(buildah_ mount "$agent")
  tar -C "$root" -cf - usr/lib/steadfast-agent var/cache/steadfast-agent | tar -C "$mounted" -xpf -
  buildah_ umount "$agent" >/dev/null
  buildah_ config \
    --entrypoint '["/usr/bin/node", "/usr/lib/steadfast-agent/bin/steadfast-agent.cjs"]' --cmd '' \
    --user 65532:65532 --workingdir / --port 9401/tcp --env PATH=/usr/local/bin:/usr/bin:/bin \
    --created-by "packaging/image/build.sh: /usr/lib/steadfast-agent (scripts/stage-agent.mjs, koffi), its code cache" \
    --label "org.opencontainers.image.title=steadfast-agent" \
    --label "org.opencontainers.image.description=The steadfast GPU-node agent: GPU, Xid, InfiniBand, NFS and training health on :9401/metrics, fatal events to the controller" \
    "${labels[@]}" "$agent"
  commit "$agent" steadfast-agent
fi

if [ "$only" != agent ]; then
  # The npm package as packaging/debian/build.sh installs it: production dependencies only.
  npm pack --ignore-scripts --silent --pack-destination "$stage" >/dev/null
  npm install --global --prefix "$stage/npm" --prefer-offline --omit=dev --no-audit --no-fund --loglevel=error "$stage/steadfast-$version.tgz" >&2
  [ -n "$revision" ] && printf '%s\n' "$revision" >"$stage/npm/lib/node_modules/steadfast/REVISION"
  controller=$(buildah_ from steadfast-node-runtime)
  mounted=$(buildah_ mount "$controller")
  mkdir -p "$mounted/usr/lib"
  cp -a "$stage/npm/lib/node_modules/steadfast" "$mounted/usr/lib/steadfast"
  chown -R 0:0 "$mounted/usr/lib/steadfast"
  buildah_ umount "$controller" >/dev/null
  buildah_ config \
    --entrypoint '["/usr/bin/node", "/usr/lib/steadfast/bin/steadfast.js"]' \
    --cmd '["controller", "--config", "/etc/steadfast/config/config.yaml"]' \
    --user 65532:65532 --workingdir / --port 9400/tcp --port 9402/tcp --env PATH=/usr/local/bin:/usr/bin:/bin \
    --created-by "packaging/image/build.sh: /usr/lib/steadfast (npm pack, production dependencies)" \
    --label "org.opencontainers.image.title=steadfast-controller" \
    --label "org.opencontainers.image.description=The steadfast controller and CLI: alerts and agents' reports in, drains and training-job recovery out" \
    "${labels[@]}" "$controller"
  commit "$controller" steadfast-controller
fi
