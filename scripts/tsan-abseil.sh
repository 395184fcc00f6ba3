#!/usr/bin/env bash
# Builds Debian's own abseil, instrumented for ThreadSanitizer, into OUT/lib
# (`make test-tsan`; OUT is $(TSAN_BUILD)/abseil-tsan).
#
# Why: Debian's libabsl is not built with -fsanitize=thread, so absl::Mutex
# (which spins and futexes, never calls pthread) is invisible to TSan, and
# every access it guards reads as a race. Built from the same source package
# (Debian's patches set the SONAMEs, the inline namespace and the options),
# with the same SONAMEs, these libraries replace the system ones in every
# process of the TSan build (the project's binaries carry an RPATH to OUT/lib),
# so gRPC, protobuf and kvtier share one abseil, whose Mutex, CondVar,
# call_once and reference counts now tell TSan what they synchronise.
#
# Does nothing when OUT/.complete names the installed libabsl-dev version.
# Needs curl and dpkg-source (dpkg-dev), clang; network to deb.debian.org
# (or $DEBIAN_MIRROR: scripts/debian-source.sh).
set -euo pipefail
out=${1:?usage: tsan-abseil.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The source package of the installed libabsl-dev; its .dsc is pinned here
# (its tarballs are checked against the .dsc: scripts/debian-source.sh). A
# Debian update of abseil needs a new pin: the version and the sha256 of its
# .dsc (scripts/pic-deps.sh pins the same).
pinned_version=20220623.1-1+deb12u2
pinned_dsc_sha256=ba731eaced569332fa4ce802a7ff2615ae57ac25beaf2d02f634ef908f2e62c2
version=$(dpkg-query -W -f='${Version}' libabsl-dev)
if [ -f "$out/.complete" ] && [ "$(cat "$out/.complete")" = "$version" ]; then
  exit 0
fi
. "$(dirname "$0")/debian-source.sh"
debian_pinned_version tsan-abseil libabsl-dev "$pinned_version"
start=$SECONDS
rm -rf "$out"/{src,build,lib,include} "$out/.complete"
debian_source_unpack tsan-abseil abseil "$version" "$pinned_dsc_sha256" \
  "$out/dl" "$out/src"

# As debian/rules configures its shared build (C++17, shared libraries),
# plus TSan. ccache, where present, shares the objects between build folders.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
CC=clang CXX=clang++ cmake -S "$out/src" -B "$out/build" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
  -DBUILD_TESTING=OFF -DABSL_PROPAGATE_CXX_STD=ON -DCMAKE_INSTALL_PREFIX="$out" \
  -DCMAKE_INSTALL_LIBDIR=lib \
  "-DCMAKE_CXX_FLAGS=-O1 -gline-tables-only -fsanitize=thread -fno-omit-frame-pointer" \
  "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread" >/dev/null
cmake --build "$out/build" -j"$(nproc)" >"$out/build.log" 2>&1 ||
  { tail -50 "$out/build.log" >&2; exit 1; }
cmake --install "$out/build" >/dev/null

# Each system libabsl has its twin here: the same SONAME, and every symbol
# it defines (not the weak copies of inline functions, which depend on the
# compiler) defined here too: the same inline namespace and options.
sysdir=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null ||
  gcc -print-multiarch)
soname() { readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'; }
strong() { nm -D --defined-only "$1" | awk '$2 ~ /^[TDBR]$/ {print $3}' | sort -u; }
defined() { nm -D --defined-only "$1" | awk '{print $3}' | sort -u; }
n=0
for sys in "$sysdir"/libabsl_*.so.*.*.*; do
  name=$(soname "$sys")
  ours="$out/lib/$name"
  if [ ! -e "$ours" ] || [ "$(soname "$ours")" != "$name" ]; then
    echo "tsan-abseil: no $name in $out/lib" >&2
    exit 1
  fi
  comm -23 <(strong "$sys") <(defined "$ours") >"$out/missing.txt"
  if [ -s "$out/missing.txt" ]; then
    echo "tsan-abseil: $name lacks symbols of $sys:" >&2
    head -20 "$out/missing.txt" >&2
    exit 1
  fi
  n=$((n + 1))
done
rm -rf "$out/build" "$out/src" "$out/missing.txt"
echo "$version" >"$out/.complete"
echo "tsan-abseil: $n libraries of abseil $version built for TSan in" \
  "$((SECONDS - start)) s ($out/lib)"
