#!/usr/bin/env bash
# Installs kvtierd, kvtierctl and their systemd files from a build folder.
#
#   deploy/install.sh [BUILD_DIR]        BUILD_DIR defaults to ./build
#
# DESTDIR stages the files under another root (packaging, tests). Without it,
# as root, it also creates the kvtier user and folders and reloads systemd.
# It never starts, stops or restarts kvtierd: after an upgrade, run
# `systemctl restart kvtierd` (the banks survive it; docs/operations.md).
# /etc/kvtier/kvtierd.flags is configuration: an existing one is kept and the
# shipped default is written beside it as kvtierd.flags.default.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
build="${1:-$repo/build}"
dest="${DESTDIR:-}"

for bin in daemon/kvtierd cli/kvtierctl; do
  if [ ! -x "$build/$bin" ]; then
    echo "install: $build/$bin is missing: build first (make build)" >&2
    exit 1
  fi
done
install -D -m 0755 "$build/daemon/kvtierd" "$dest/usr/bin/kvtierd"
install -D -m 0755 "$build/cli/kvtierctl" "$dest/usr/bin/kvtierctl"
install -D -m 0644 "$here/kvtierd.service" \
  "$dest/usr/lib/systemd/system/kvtierd.service"
install -D -m 0644 "$here/tmpfiles.d/kvtier.conf" \
  "$dest/usr/lib/tmpfiles.d/kvtier.conf"
install -D -m 0644 "$here/sysusers.d/kvtier.conf" \
  "$dest/usr/lib/sysusers.d/kvtier.conf"
install -D -m 0644 "$repo/docs/operations.md" \
  "$dest/usr/share/doc/kvtier/operations.md"
if [ -e "$dest/etc/kvtier/kvtierd.flags" ]; then
  install -m 0644 "$here/kvtierd.flags" "$dest/etc/kvtier/kvtierd.flags.default"
  echo "install: kept $dest/etc/kvtier/kvtierd.flags (new default beside it)"
  # The unit lets the daemon write only the shipped folders.
  for f in shm_dir state_dir; do
    kept="$(sed -n "s/^--$f=//p" "$dest/etc/kvtier/kvtierd.flags" | tail -1)"
    shipped="$(sed -n "s/^--$f=//p" "$here/kvtierd.flags" | tail -1)"
    if [ "$kept" != "$shipped" ]; then
      echo "install: warning: the kept flag file has --$f=${kept:-(unset)};" \
        "the unit lets kvtierd write only --$f=$shipped (see" \
        "kvtierd.flags.default)" >&2
    fi
  done
else
  install -D -m 0644 "$here/kvtierd.flags" "$dest/etc/kvtier/kvtierd.flags"
fi

if [ -z "$dest" ] && [ "$(id -u)" -eq 0 ]; then
  systemd-sysusers kvtier.conf
  systemd-tmpfiles --create kvtier.conf
  if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
  echo "install: done; enable with: systemctl enable --now kvtierd"
fi
