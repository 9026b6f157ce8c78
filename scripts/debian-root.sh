#!/usr/bin/env bash
# Makes a Debian root file system in DIR with mmdebstrap: the Essential packages, apt, and the
# extra packages named. Used by the Debian package test (a real root to `apt install` the .debs
# into) and for container images.
#
# Usage: scripts/debian-root.sh SUITE DIR [EXTRA_PACKAGE...]
#   SUITE           a Debian suite or codename: trixie, bookworm, unstable, ...
#   DIR             where to unpack the root; made when missing, and must be empty
#   EXTRA_PACKAGE   further packages to include (apt resolves their dependencies)
# Environment:
#   DEBIAN_ROOT_VARIANT   mmdebstrap's --variant (default: apt, the Essential set plus apt)
#   DEBIAN_ROOT_MIRROR    the archive (default: http://deb.debian.org/debian)
#   DEBIAN_ROOT_CACHE     where made roots are kept as tarballs
#                         (default: ${TMPDIR:-/tmp}/steadfast-debian-roots)
#
# The first run for a suite, variant, mirror, architecture and package list downloads and writes
# a tarball into the cache; later runs with the same inputs unpack that tarball and download
# nothing. Delete the tarball (or the cache folder) to take newer packages. Runs as root (the
# root's files keep their owners); the root has no package lists (apt-get update fetches them).
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 SUITE DIR [EXTRA_PACKAGE...]" >&2
  exit 2
fi
suite=$1
dir=$2
shift 2
variant=${DEBIAN_ROOT_VARIANT:-apt}
mirror=${DEBIAN_ROOT_MIRROR:-http://deb.debian.org/debian}
cache=${DEBIAN_ROOT_CACHE:-${TMPDIR:-/tmp}/steadfast-debian-roots}
arch=$(dpkg --print-architecture)

[ "$(id -u)" -eq 0 ] || { echo "debian-root.sh: run as root (the root's files keep their owners)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || { echo "debian-root.sh: mmdebstrap is missing: apt-get install mmdebstrap" >&2; exit 1; }
if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
  echo "debian-root.sh: $dir is not empty" >&2
  exit 1
fi

# The cache key names every input that changes what mmdebstrap makes.
packages=$(printf '%s\n' "$@" | sed '/^$/d' | sort -u | paste -sd, -)
key=$(printf '%s\n' "$suite" "$variant" "$mirror" "$arch" "$packages" | sha256sum | cut -c1-16)
tarball=$cache/$suite-$variant-$arch-$key.tar

mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
  echo "debian-root.sh: making a $suite root ($variant${packages:+, with $packages}) into $tarball" >&2
  partial=$(mktemp "$tarball.XXXXXX.tar")
  trap 'rm -f "$partial"' EXIT
  # Written beside the cache entry and renamed into place, so a run stopped halfway leaves no
  # tarball that a later run would take for a whole root.
  mmdebstrap --quiet --variant="$variant" --architectures="$arch" ${packages:+--include="$packages"} \
    "$suite" "$partial" "$mirror"
  mv "$partial" "$tarball"
  trap - EXIT
fi

mkdir -p "$dir"
tar --numeric-owner --same-permissions --extract --file "$tarball" --directory "$dir"
