#!/usr/bin/env bash
# Checks libkvtier.so's face (issue 15): it exports its C ABI alone, the
# kvt_* functions under version node KVTIER_1, and no C++ symbol at all (the
# C++ layer, kvtier/kvtier.hpp, is header-only).
#
# It also lists what the library needs at run time (readelf -d, DT_NEEDED).
# The goal is the C and C++ runtimes and the system's own libraries alone
# (libc, libm, libstdc++, libgcc_s, the dynamic loader, and libpthread,
# libdl, librt where linked): no gRPC, protobuf, abseil, spdlog, libxxhash
# or libcrypto, which an engine may bring in other versions or a host may
# lack. abseil, protobuf, libxxhash and libcrypto are linked statically
# (scripts/pic-deps.sh, cmake/KvtierPicDeps.cmake); gRPC leaves when the
# engine RPCs move to the framed unix-socket protocol.
#
#   --needed=print  (default) prints the list, and what lies outside the goal
#   --needed=pic    fails if the list names a library that KVTIER_PIC_DEPS
#                   links statically (abseil, protobuf, libxxhash,
#                   libcrypto), or if one of their symbols is left
#                   undefined
#   --needed=check  the same, and fails if the list names anything outside
#                   the goal (ctest libkvtier_static_deps)
#
# Usage: check_exports.sh [--needed=print|pic|check] libkvtier.so
set -euo pipefail
needed_mode=print
case "${1:-}" in
  --needed=print|--needed=pic|--needed=check)
    needed_mode=${1#--needed=}; shift ;;
  --needed=*) echo "unknown option $1" >&2; exit 2 ;;
esac
lib=${1:?usage: check_exports.sh [--needed=print|pic|check] libkvtier.so}

# Exports: every defined dynamic symbol, with its version node.
raw=$(nm -D --defined-only "$lib" | awk '{print $3}')
[ -n "$raw" ] || { echo "no exported symbols in $lib"; exit 1; }
bad=$(echo "$raw" | grep -Ev '^(kvt_[a-z0-9_]+@@KVTIER_1|KVTIER_1@@KVTIER_1|KVTIER_1)$' || true)
if [ -n "$bad" ]; then
  echo "libkvtier.so exports symbols outside its C ABI (kvt_*@@KVTIER_1):"
  echo "$bad" | c++filt | head -20
  exit 1
fi
syms=$(echo "$raw" | sed 's/@.*//' | grep -v '^KVTIER_1$')
for needed in kvt_connect kvt_attach kvt_lookup kvt_reserve kvt_commit \
              kvt_evict kvt_rehydrate kvt_last_error kvt_reservation_free \
              kvt_pending_free; do
  echo "$syms" | grep -qx "$needed" || { echo "missing export $needed"; exit 1; }
done
echo "libkvtier.so exports $(echo "$syms" | wc -l) symbols, all kvt_* at KVTIER_1"

# Run-time dependencies.
deps=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "libkvtier.so DT_NEEDED ($(echo "$deps" | wc -l)):"
echo "$deps" | sed 's/^/  /'
allowed='^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux-x86-64|ld-linux-aarch64)\.so(\.[0-9]+)*$'
static='^(libabsl_[a-z0-9_]+|libprotobuf(-lite)?|libxxhash|libcrypto)\.so(\.[0-9]+)*$'
if [ "$needed_mode" = pic ] || [ "$needed_mode" = check ]; then
  linked=$(echo "$deps" | grep -E "$static" || true)
  if [ -n "$linked" ]; then
    echo "FAIL: libkvtier.so needs libraries it should link statically" \
      "(KVTIER_PIC_DEPS):"
    echo "$linked" | sed 's/^/  /'
    exit 1
  fi
  # Nor may it leave one of their symbols undefined, for whatever copy the
  # process holds to resolve; but for the weak references to TLS init
  # functions (_ZTH*) that g++ emits beside each extern thread_local (here
  # abseil's cordz_next_sample, constant-initialised: nothing defines one).
  undefined=$(nm -D --undefined-only "$lib" |
    awk '$1 == "U" || ($1 == "w" && $2 !~ /^_ZTH/) {print $2}' |
    grep -E 'N4absl|N6google8protobuf|N4grpc|^grpc_|^gpr_|^XXH|^(EVP|OPENSSL|CRYPTO|ERR)_' || true)
  if [ -n "$undefined" ]; then
    echo "FAIL: libkvtier.so leaves symbols of abseil, protobuf, libxxhash or" \
      "libcrypto undefined ($(echo "$undefined" | wc -l)):"
    echo "$undefined" | head -10 | c++filt | sed 's/^/  /'
    exit 1
  fi
  echo "no abseil, protobuf, libxxhash or libcrypto among them, nor any" \
    "symbol of theirs left undefined"
fi
outside=$(echo "$deps" | grep -Ev "$allowed" || true)
if [ -n "$outside" ]; then
  echo "outside the goal ($(echo "$outside" | wc -l)):"
  echo "$outside" | sed 's/^/  /'
  if [ "$needed_mode" = check ]; then
    echo "FAIL: libkvtier.so needs libraries an engine may bring in other versions"
    exit 1
  fi
  echo "(printed only; --needed=check asserts it)"
fi
