#!/usr/bin/env bash
# Prunes a node_modules tree as npm installed it down to what Node.js loads on this machine, for
# the Debian packages (packaging/debian/build.sh) and the agent image (packaging/image/build.sh).
# npm's tree carries what is never loaded: tests, examples, docs, TypeScript sources and
# declarations, source maps, lint and CI settings, C, C++ and assembly sources, and prebuilt binaries for other
# systems. They go; licence files stay. Of the native objects only this machine's glibc builds
# stay (the machine of `node` on PATH), stripped as dh_strip would.
# Usage: packaging/prune-node-modules.sh NODE_MODULES
# Needs find, readelf and strip (binutils).
set -euo pipefail

[ $# -eq 1 ] && [ -d "$1" ] || { echo "usage: $0 NODE_MODULES" >&2; exit 2; }
modules=$1
rm -rf "$modules/.bin" "$modules/.package-lock.json"
dirs=()
while IFS= read -r -d '' dir; do
  # Only a package's own top-level folder: a `docs` or `test` deeper down may be code.
  if [ -f "$(dirname "$dir")/package.json" ]; then dirs+=("$dir"); fi
done < <(find "$modules" -type d \( -name test -o -name tests -o -name __tests__ -o -name example -o -name examples \
  -o -name benchmark -o -name benchmarks -o -name docs -o -name coverage -o -name .github -o -name .husky -o -name .idea \
  -o -name .claude -o -name .vscode \) -print0)
[ ${#dirs[@]} -eq 0 ] || rm -rf "${dirs[@]}"
find "$modules" -type f \( -name '*.map' -o -name '*.ts' -o -name '*.mts' -o -name '*.cts' -o -name '*.tsbuildinfo' \
  -o -name '*.flow' -o -name '*.md' -o -name '*.markdown' -o -name '*.html' -o -name '*.sh' \
  -o -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.h' -o -name '*.hh' -o -name '*.hpp' -o -name '*.inc' -o -name '*.def' \
  -o -name '*.S' -o -name '*.asm' -o -name binding.gyp -o -name CMakeLists.txt -o -name Makefile \
  -o -name '.npmignore' -o -name '.gitattributes' -o -name '.gitignore' -o -name '.gitkeep' -o -name '.eslintrc*' -o -name '.eslintignore' \
  -o -name 'eslint.config.*' -o -name '.prettierrc*' -o -name '.prettierignore' -o -name '.editorconfig' -o -name '.travis.yml' \
  -o -name '.nycrc*' -o -name '.taprc' -o -name '.nvmrc' -o -name '.jshintrc' -o -name '.jsbeautifyrc' -o -name '.codeclimate.yml' \
  -o -name '.mailmap' -o -name '.checkbuild' -o -name '.nojekyll' -o -name 'tsconfig*.json' \) \
  ! -iname 'licen[cs]e*' ! -iname 'copying*' ! -iname 'notice*' -delete
# Native objects: only this machine's glibc builds are loaded. The bare-* packages' addons are
# for the Bare runtime (under Node.js, tar-fs uses Node's own fs); musl, macOS, Windows, Android
# and other architectures' builds are never loaded here. What stays is stripped, as dh_strip
# would, and not executable (node loads it with dlopen).
machine=$(readelf -h "$(command -v node)" | sed -n 's/^ *Machine: *//p')
while IFS= read -r -d '' object; do
  if [[ "$object" == *.node ]] && [ "$(head -c 4 "$object" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] &&
    [ "$(readelf -h "$object" | sed -n 's/^ *Machine: *//p')" = "$machine" ] &&
    readelf -d "$object" | grep -q 'Shared library: \[libc\.so\.6\]'; then
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$object"
    chmod 0644 "$object"
  else
    rm -f "$object"
  fi
done < <(find "$modules" -type f \( -name '*.node' -o -name '*.bare' -o -name '*.so' -o -name '*.so.*' -o -name '*.dylib' -o -name '*.dll' -o -name '*.exe' \) -print0)
find "$modules" -type d -name prebuilds -empty -delete
find "$modules" -depth -type d -empty -delete
# Executable: what has a #! line (the packages' own commands); nothing else.
find "$modules" -type d -exec chmod 0755 {} +
find "$modules" -type f -exec chmod 0644 {} +
find "$modules" -type f -exec awk 'FNR == 1 && /^#!/ { print FILENAME } { nextfile }' {} + | xargs -d '\n' -r chmod 0755
