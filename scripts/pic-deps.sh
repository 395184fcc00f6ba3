#!/usr/bin/env bash
# Builds Debian's own abseil and protobuf (the installed versions, from their
# source packages) as static, position-independent archives with hidden
# symbols, into OUT/lib (`make build`; OUT is $(BUILD)/pic-deps):
#
#   OUT/lib/libabsl.a      every abseil library, one archive
#   OUT/lib/libprotobuf.a  protobuf's full runtime (no protoc, no tests)
#
# Why (issue 15; docs/abi.md, "What libkvtier.so needs at run time"):
# libkvtier.so links these (CMake KVTIER_PIC_DEPS, cmake/KvtierPicDeps.cmake)
# behind -Wl,--exclude-libs,ALL, so a pip-installed kvtier needs neither
# library on the host, and an engine that loads its own abseil or protobuf,
# in any version, meets none of ours. Debian's own static archives cannot be
# used: libprotobuf.a and four of abseil's are built without -fPIC and carry
# local-exec TLS (R_X86_64_TPOFF32), which ld refuses in a shared object.
#
# The same source as the shared libraries everything else links (Debian's
# patches applied), the same C++ standard (17), flags and options as
# debian/rules, and no NDEBUG (neither Debian build defines it): the headers
# in /usr/include, which the project compiles against, are checked to be the
# patched source's own, byte for byte, and every symbol Debian's shared
# libraries define to be defined here too (so the inline namespace and
# options agree). Added to Debian's flags: -fPIC, -fvisibility=hidden and
# -fvisibility-inlines-hidden. protobuf is built without zlib (nothing here
# uses io/gzip_stream.h; libkvtier.so then needs no libz).
#
# Does nothing when OUT/.complete names the pinned versions and this
# script's own sha256 (a changed recipe rebuilds). ccache, where present,
# serves the objects of an earlier build. Needs curl, dpkg-source
# (dpkg-dev), cmake, g++; network to deb.debian.org (or $DEBIAN_MIRROR:
# scripts/debian-source.sh).
set -euo pipefail
out=${1:?usage: pic-deps.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The source packages of the installed libabsl-dev and libprotobuf-dev, each
# .dsc pinned (its tarballs are checked against it). A Debian update needs
# new pins: the version and the sha256 of the .dsc (scripts/tsan-abseil.sh
# pins the same abseil).
absl_version=20220623.1-1+deb12u2
absl_dsc_sha256=ba731eaced569332fa4ce802a7ff2615ae57ac25beaf2d02f634ef908f2e62c2
protobuf_version=3.21.12-3+deb12u1
protobuf_dsc_sha256=22e31f6dfc06d85a9054bf19603a412698c0d2f760a754650cd2385ea303cee0

recipe=$(sha256sum "$here/pic-deps.sh" | cut -c1-16)
stamp="abseil $absl_version protobuf $protobuf_version recipe $recipe"
if [ -f "$out/.complete" ] && [ "$(cat "$out/.complete")" = "$stamp" ]; then
  exit 0
fi
. "$here/debian-source.sh"
debian_pinned_version pic-deps libabsl-dev "$absl_version"
debian_pinned_version pic-deps libprotobuf-dev "$protobuf_version"
start=$SECONDS
rm -rf "$out"/{src,build,stage,lib} "$out/.complete"
mkdir -p "$out/lib"

# The headers the project compiles against must be the source's own.
same_headers() {
  local package=$1 src=$2 n=0 h
  for h in $(dpkg -L "$package" | grep -E '^/usr/include/.*\.(h|inc)$'); do
    if ! cmp -s "$h" "$src/${h#/usr/include/}"; then
      echo "pic-deps: $h differs from $package's source" \
        "(${src#"$out"/}/${h#/usr/include/})" >&2
      exit 1
    fi
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "pic-deps: no headers in $package" >&2; exit 1; }
  echo "$n"
}

# Every symbol Debian's shared library defines (not the weak copies of
# inline functions) is defined in our archive, less those matching $3.
same_symbols() {
  local archive=$1 skip=$2 sys
  shift 2
  comm -23 \
    <(for sys in "$@"; do nm -D --defined-only "$sys"; done |
      awk '$2 ~ /^[TDBR]$/ {print $3}' | grep -Ev "$skip" | sort -u) \
    <(nm --defined-only "$archive" 2>/dev/null | awk 'NF == 3 {print $3}' |
      sort -u) >"$out/missing.txt"
  if [ -s "$out/missing.txt" ]; then
    echo "pic-deps: $archive lacks symbols of $*:" >&2
    head -20 "$out/missing.txt" | c++filt >&2
    exit 1
  fi
  rm -f "$out/missing.txt"
}

# debian/rules' flags (dpkg-buildflags for bookworm, less -g and the
# build-path map; build type None: no NDEBUG), plus hidden symbols.
flags="-O2 -fstack-protector-strong -Wformat -Werror=format-security"
flags="$flags -Wdate-time -D_FORTIFY_SOURCE=2"
flags="$flags -fvisibility=hidden -fvisibility-inlines-hidden"
common=(-DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=$flags"
  -DCMAKE_CXX_STANDARD=17 -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  -DBUILD_SHARED_LIBS=OFF)
if command -v ccache >/dev/null; then
  common+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
build() {  # build NAME [cmake --build arguments]
  local name=$1
  shift
  cmake --build "$out/build/$name" -j"$(nproc)" "$@" \
    >"$out/build-$name.log" 2>&1 ||
    { tail -50 "$out/build-$name.log" >&2; exit 1; }
  rm -f "$out/build-$name.log"
}
sysdir=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null ||
  gcc -print-multiarch)

# abseil, as debian/rules' static build (C++17), installed into stage/ and
# its archives merged into one (ld then resolves the order among them).
absl_start=$SECONDS
debian_source_unpack pic-deps abseil "$absl_version" "$absl_dsc_sha256" \
  "$out/dl" "$out/src/abseil"
absl_headers=$(same_headers libabsl-dev "$out/src/abseil")
cmake -S "$out/src/abseil" -B "$out/build/abseil" "${common[@]}" \
  -DBUILD_TESTING=OFF -DABSL_PROPAGATE_CXX_STD=ON \
  -DCMAKE_INSTALL_PREFIX="$out/stage" \
  -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
build abseil
cmake --install "$out/build/abseil" >/dev/null
absl_archives=("$out"/stage/lib/libabsl_*.a)
{
  echo "CREATE $out/lib/libabsl.a"
  for a in "${absl_archives[@]}"; do echo "ADDLIB $a"; done
  echo "SAVE"
  echo "END"
} | ar -M
same_symbols "$out/lib/libabsl.a" '^$' "$sysdir"/libabsl_*.so.*.*.*
absl_seconds=$((SECONDS - absl_start))

# protobuf's runtime (the full library: tier.pb.cc uses descriptors and
# reflection), by its CMake build rather than debian/rules' autotools one
# (the same sources; the symbol check below holds it to Debian's library).
protobuf_start=$SECONDS
debian_source_unpack pic-deps protobuf "$protobuf_version" \
  "$protobuf_dsc_sha256" "$out/dl" "$out/src/protobuf"
protobuf_headers=$(same_headers libprotobuf-dev "$out/src/protobuf/src")
cmake -S "$out/src/protobuf" -B "$out/build/protobuf" "${common[@]}" \
  -Dprotobuf_BUILD_TESTS=OFF -Dprotobuf_BUILD_PROTOC_BINARIES=OFF \
  -Dprotobuf_BUILD_SHARED_LIBS=OFF -Dprotobuf_WITH_ZLIB=OFF \
  -Dprotobuf_INSTALL=OFF >/dev/null
build protobuf --target libprotobuf
cp "$out/build/protobuf/libprotobuf.a" "$out/lib/"
same_symbols "$out/lib/libprotobuf.a" 'Gzip(In|Out)putStream' \
  "$sysdir"/libprotobuf.so.*.*.*
protobuf_seconds=$((SECONDS - protobuf_start))

# Position-independent throughout: no local-exec TLS (x86-64, arm64).
if readelf -rW "$out"/lib/*.a | grep -Eq 'TPOFF32|TLSLE'; then
  echo "pic-deps: local-exec TLS relocations in $out/lib" >&2
  exit 1
fi

rm -rf "$out/src" "$out/build" "$out/stage"
echo "$stamp" >"$out/.complete"
echo "pic-deps: abseil $absl_version (${#absl_archives[@]} libraries," \
  "$absl_headers headers checked, $absl_seconds s) and protobuf" \
  "$protobuf_version ($protobuf_headers headers checked," \
  "$protobuf_seconds s), static -fPIC, built in $((SECONDS - start)) s" \
  "($out/lib)"
