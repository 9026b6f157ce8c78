#!/usr/bin/env bash
# Copies what Debian's Node.js needs to run out of a Debian root into an empty directory: the
# node binary and the shared libraries it loads (as the dynamic loader resolves them), the
# JavaScript Debian's node loads from /usr/share/nodejs (acorn, cjs-module-lexer, undici, ...),
# the C.UTF-8 locale, OpenSSL's configuration, the CA bundle and the packages' copyright files.
# No shell, no package manager, no coreutils: the root of the steadfast images (build.sh).
#
# Usage: packaging/image/runtime-root.sh SRC DST
#   SRC   a Debian root holding the nodejs and ca-certificates packages, installed or only
#         extracted (mmdebstrap --variant=extract); "/" inside a Debian build container
#   DST   an empty directory (made when missing)
# Runs as root: it runs SRC's dynamic loader in a chroot to list node's libraries, and checks
# node in DST the same way at the end.
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: $0 SRC DST" >&2; exit 2; }
src=$(cd "$1" && pwd)
mkdir -p "$2"
dst=$(cd "$2" && pwd)
[ -z "$(ls -A "$dst")" ] || { echo "runtime-root.sh: $dst is not empty" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "runtime-root.sh: run as root (chroot)" >&2; exit 1; }
[ -x "$src/usr/bin/node" ] || { echo "runtime-root.sh: $src has no /usr/bin/node (install the nodejs package)" >&2; exit 1; }

# The merged-/usr links: base-files makes them on install, an extracted root lacks them.
for dir in lib lib64; do
  if [ -d "$src/usr/$dir" ] && [ ! -e "$src/$dir" ] && [ ! -L "$src/$dir" ]; then ln -s "usr/$dir" "$src/$dir"; fi
  if [ -d "$src/usr/$dir" ]; then mkdir -p "$dst/usr/$dir" && ln -s "usr/$dir" "$dst/$dir"; fi
done

# Resolves PATH inside SRC (a symlink's absolute target is SRC's, not this machine's) and
# copies the file it names to PATH in DST: a regular file where the loader looks for it.
copy_resolved() {
  local path=$1 hops=0 target
  local at=$path
  while [ -L "$src$at" ]; do
    hops=$((hops + 1))
    [ $hops -le 16 ] || { echo "runtime-root.sh: too many symlinks at $path" >&2; exit 1; }
    target=$(readlink "$src$at")
    case $target in
      /*) at=$target ;;
      *) at=$(realpath -m -s "$(dirname "$at")/$target") ;;
    esac
  done
  [ -f "$src$at" ] || { echo "runtime-root.sh: $path (-> $at) is not a file in $src" >&2; exit 1; }
  mkdir -p "$dst$(dirname "$path")"
  cp -p "$src$at" "$dst$path"
}

# The dynamic loader node asks for, and every library it loads (what ldd prints, without ldd).
loader=$(cd "$src" && for candidate in lib64/ld-linux-*.so.* lib/ld-linux-*.so.*; do [ -e "$candidate" ] && { echo "/$candidate"; break; }; done)
[ -n "$loader" ] || { echo "runtime-root.sh: no dynamic loader in $src/lib64 or $src/lib" >&2; exit 1; }
libraries=$(chroot "$src" "$loader" --list /usr/bin/node | sed -n 's/^.*=> \(\/[^ ]*\) (0x.*$/\1/p')
[ -n "$libraries" ] || { echo "runtime-root.sh: the loader listed no library for node" >&2; exit 1; }
copy_resolved /usr/bin/node
copy_resolved "$loader"
for library in $libraries; do copy_resolved "$library"; done

# Debian builds node to load some of its own modules from /usr/share/nodejs; types and corepack
# are for development.
mkdir -p "$dst/usr/share"
cp -a "$src/usr/share/nodejs" "$dst/usr/share/nodejs"
rm -rf "$dst/usr/share/nodejs/@types" "$dst/usr/share/nodejs/undici-types" "$dst/usr/share/nodejs/corepack"
if [ -d "$src/usr/lib/locale/C.utf8" ]; then
  mkdir -p "$dst/usr/lib/locale"
  cp -a "$src/usr/lib/locale/C.utf8" "$dst/usr/lib/locale/"
fi

# OpenSSL reads its configuration at start; Debian's node reads the system CA bundle as extra CA
# certificates. update-ca-certificates makes the bundle on install: an extracted root has none.
mkdir -p "$dst/etc/ssl/certs" "$dst/usr/lib/ssl"
[ -f "$src/etc/ssl/openssl.cnf" ] && cp -p "$src/etc/ssl/openssl.cnf" "$dst/etc/ssl/openssl.cnf"
ln -s /etc/ssl/openssl.cnf "$dst/usr/lib/ssl/openssl.cnf"
if [ -s "$src/etc/ssl/certs/ca-certificates.crt" ]; then
  cp -p "$src/etc/ssl/certs/ca-certificates.crt" "$dst/etc/ssl/certs/ca-certificates.crt"
else
  find "$src/usr/share/ca-certificates" -name '*.crt' -type f -print0 | LC_ALL=C sort -z | xargs -0 cat >"$dst/etc/ssl/certs/ca-certificates.crt"
fi
[ -s "$dst/etc/ssl/certs/ca-certificates.crt" ] || { echo "runtime-root.sh: no CA certificates in $src (install ca-certificates)" >&2; exit 1; }

# The Debian packages' licences travel with their binaries.
for copyright in "$src"/usr/share/doc/*/copyright; do
  [ -f "$copyright" ] || continue
  package=$(basename "$(dirname "$copyright")")
  install -D -m 0644 "$copyright" "$dst/usr/share/doc/$package/copyright"
done

# Names for root and the images' user (65532), for tools that look them up; no login shell.
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nsteadfast:x:65532:65532:steadfast:/nonexistent:/usr/sbin/nologin\n' >"$dst/etc/passwd"
printf 'root:x:0:\nsteadfast:x:65532:\n' >"$dst/etc/group"
install -d -m 1777 "$dst/tmp"
install -d -m 0755 "$dst/root"

# What was copied must run on its own: start node in DST, loading what the steadfast agent and
# controller load first (TLS, fetch, zlib, the CommonJS lexer).
chroot "$dst" /usr/bin/node -e 'require("node:https"); require("node:zlib").gzipSync("x"); new URL("http://x"); if (typeof fetch !== "function") process.exit(1)'
