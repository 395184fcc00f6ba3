#!/usr/bin/env bash
# Checks that libkvtier.so exports only its C ABI (kvt_*) and kvtier's public
# C++ API: no gRPC, protobuf, abseil or internal kvtier symbols.
set -euo pipefail
lib=${1:?usage: check_exports.sh libkvtier.so}
syms=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | c++filt)
[ -n "$syms" ] || { echo "no exported symbols in $lib"; exit 1; }
bad=$(echo "$syms" | grep -Ev '^(kvt_[a-z_]+|kvtier::[A-Z].*|kvtier::client::TransferEngine::.*|(typeinfo|typeinfo name|vtable) for kvtier::[A-Z].*|KVTIER_1)$' || true)
if [ -n "$bad" ]; then
  echo "libkvtier.so exports symbols outside its API:"; echo "$bad" | head -20; exit 1
fi
for needed in kvt_connect kvt_attach kvt_lookup kvt_reserve kvt_commit kvt_evict kvt_rehydrate kvt_last_error; do
  echo "$syms" | grep -qx "$needed" || { echo "missing export $needed"; exit 1; }
done
echo "libkvtier.so exports $(echo "$syms" | wc -l) symbols, all in its API"
