#!/usr/bin/env bash
# deploy_test: the systemd deployment as installed by deploy/install.sh.
#
#   tests/deploy_test.sh BUILD_DIR
#
# 1. install.sh stages every file under a DESTDIR and keeps an existing
#    flag file on a second run;
# 2. `systemd-analyze verify` passes on the installed unit with no warning
#    about it (ExecStart's /usr/bin/kvtierd is pointed at the staged binary,
#    since the check insists the binary exists), and the same check rejects a
#    unit with a misspelt key, so it can fail;
# 3. systemd-sysusers creates the kvtier user, and systemd-tmpfiles creates
#    /run/kvtier and gives /dev/hugepages to the kvtier group, in a scratch
#    root (as root only: tmpfiles must chown);
# 4. the staged kvtierd accepts the shipped flag files (every flag exists);
# 5. the shipped flags put the sockets, banks and journals in the folders the
#    unit lets the daemon write, which tmpfiles.d or the unit create, and
#    set a per-uid budget; install.sh warns when a kept flag file points the
#    banks elsewhere.
set -euo pipefail
build="$(cd "${1:?usage: deploy_test.sh BUILD_DIR}" && pwd)"
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d /tmp/kvtier-deploy-test.XXXXXX)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. Install into a staging root, twice.
stage="$work/stage"
DESTDIR="$stage" "$repo/deploy/install.sh" "$build" >/dev/null
for f in usr/bin/kvtierd usr/bin/kvtierctl \
         usr/lib/systemd/system/kvtierd.service \
         usr/lib/tmpfiles.d/kvtier.conf usr/lib/sysusers.d/kvtier.conf \
         usr/share/doc/kvtier/operations.md etc/kvtier/kvtierd.flags; do
  [ -f "$stage/$f" ] || fail "install.sh did not install /$f"
done
echo "--edited" >> "$stage/etc/kvtier/kvtierd.flags"
DESTDIR="$stage" "$repo/deploy/install.sh" "$build" >/dev/null
grep -q -- "--edited" "$stage/etc/kvtier/kvtierd.flags" ||
  fail "a second install overwrote the edited flag file"
[ -f "$stage/etc/kvtier/kvtierd.flags.default" ] ||
  fail "a second install did not put the new default beside the flag file"
echo "ok: install.sh stages the files and keeps the flag file"

# 2. systemd-analyze verify.
if ! command -v systemd-analyze >/dev/null; then
  fail "systemd-analyze is missing (Debian package: systemd)"
fi
unit_src="$stage/usr/lib/systemd/system/kvtierd.service"
grep -q '^ExecStart=/usr/bin/kvtierd --flagfile=/etc/kvtier/kvtierd.flags$' \
  "$unit_src" || fail "the unit does not start /usr/bin/kvtierd with the flag file"
# Returns 0 when systemd-analyze verify accepts $1 without a word about it.
verify_unit() {
  local out rc=0
  out="$(systemd-analyze verify --man=no "$1" 2>&1)" || rc=$?
  if [ "$rc" -ne 0 ] || grep -q "$(basename "$1")" <<<"$out"; then
    echo "$out"
    return 1
  fi
}
mkdir -p "$work/units"
sed "s#^ExecStart=/usr/bin/kvtierd #ExecStart=$stage/usr/bin/kvtierd #" \
  "$unit_src" > "$work/units/kvtierd.service"
grep -q "^ExecStart=$stage/usr/bin/kvtierd " "$work/units/kvtierd.service" ||
  fail "could not point ExecStart at the staged binary"
verify_unit "$work/units/kvtierd.service" ||
  fail "systemd-analyze verify rejects deploy/kvtierd.service"
mkdir -p "$work/bad"
sed 's/^NoNewPrivileges=/NoNewPrivilege=/' "$work/units/kvtierd.service" \
  > "$work/bad/kvtierd.service"
if verify_unit "$work/bad/kvtierd.service" >/dev/null; then
  fail "the verify check accepted a unit with a misspelt key"
fi
echo "ok: systemd-analyze verify passes on the unit (and fails a broken one)"

# 3. sysusers and tmpfiles in a scratch root.
root="$work/root"
mkdir -p "$root/etc" "$root/dev/hugepages" "$root/dev/shm"
systemd-sysusers --root="$root" "$stage/usr/lib/sysusers.d/kvtier.conf" \
  >/dev/null 2>&1 || fail "systemd-sysusers rejects sysusers.d/kvtier.conf"
grep -q '^kvtier:' "$root/etc/passwd" || fail "no kvtier user created"
grep -q '^kvtier:' "$root/etc/group" || fail "no kvtier group created"
if [ "$(id -u)" -eq 0 ]; then
  systemd-tmpfiles --root="$root" --create \
    "$stage/usr/lib/tmpfiles.d/kvtier.conf" ||
    fail "systemd-tmpfiles rejects tmpfiles.d/kvtier.conf"
  kvtier_uid="$(awk -F: '$1 == "kvtier" { print $3 }' "$root/etc/passwd")"
  kvtier_gid="$(awk -F: '$1 == "kvtier" { print $3 }' "$root/etc/group")"
  [ "$(stat -c '%a %u %g' "$root/run/kvtier")" = "750 $kvtier_uid $kvtier_gid" ] ||
    fail "/run/kvtier is $(stat -c '%a %u %g' "$root/run/kvtier")"
  [ "$(stat -c '%a %u %g' "$root/dev/shm/kvtier")" = "750 $kvtier_uid $kvtier_gid" ] ||
    fail "/dev/shm/kvtier is $(stat -c '%a %u %g' "$root/dev/shm/kvtier")"
  [ "$(stat -c '%a %g' "$root/dev/hugepages")" = "1770 $kvtier_gid" ] ||
    fail "/dev/hugepages is $(stat -c '%a %g' "$root/dev/hugepages")"
  echo "ok: sysusers creates kvtier; tmpfiles creates /run/kvtier and /dev/shm/kvtier and opens /dev/hugepages to the group"
else
  echo "ok: sysusers creates kvtier (tmpfiles skipped: needs root to chown)"
fi

# 4. The shipped flag files name only flags kvtierd has. --helpfull parses
#    the flag file first and exits before serving.
for flags in "$repo/deploy/kvtierd.flags" "$repo/deploy/dev.flags"; do
  out="$("$stage/usr/bin/kvtierd" --flagfile="$flags" --helpfull 2>&1)" || true
  if grep -q "^ERROR" <<<"$out"; then
    grep "^ERROR" <<<"$out" >&2
    fail "kvtierd rejects $(basename "$flags")"
  fi
  grep -q -- "--metrics_address" <<<"$out" ||
    fail "kvtierd --helpfull printed no flags for $(basename "$flags")"
done
echo "ok: kvtierd accepts deploy/kvtierd.flags and deploy/dev.flags"

# 5. The flags' folders are the unit's.
flags="$repo/deploy/kvtierd.flags"
# The value of flag $1 in the shipped flag file ("" when absent).
flag() { sed -n "s/^--$1=//p" "$flags" | tail -1; }
# The value of unit key $1 ("" when absent).
key() { sed -n "s/^$1=//p" "$unit_src" | tail -1; }
[ "$(dirname "$(flag socket)")" = "/run/$(key RuntimeDirectory)" ] ||
  fail "--socket=$(flag socket) is not in the unit's RuntimeDirectory"
[ "$(flag state_dir)" = "/var/lib/$(key StateDirectory)" ] ||
  fail "--state_dir=$(flag state_dir) is not the unit's StateDirectory"
[ "$(key StateDirectoryMode)" = "0700" ] ||
  fail "StateDirectoryMode=$(key StateDirectoryMode), not 0700"
read -r -a writable <<<"$(key ReadWritePaths)"
[ "${writable[0]}" = "$(flag shm_dir)" ] ||
  fail "--shm_dir=$(flag shm_dir) is not the unit's first ReadWritePaths="
[ "$(key ReadOnlyPaths)" = "$(dirname "$(flag shm_dir)")" ] ||
  fail "the unit does not keep the rest of $(dirname "$(flag shm_dir)") read-only"
grep -Eq "^d +$(flag shm_dir) +0750 +kvtier +kvtier " \
  "$repo/deploy/tmpfiles.d/kvtier.conf" ||
  fail "tmpfiles.d does not create $(flag shm_dir) 0750 kvtier:kvtier"
[ "$(flag uid_budget_bytes)" -gt 0 ] 2>/dev/null ||
  fail "the shipped flags set no --uid_budget_bytes"
sed -i "s#^--shm_dir=.*#--shm_dir=/dev/shm#" "$stage/etc/kvtier/kvtierd.flags"
out="$(DESTDIR="$stage" "$repo/deploy/install.sh" "$build" 2>&1)"
grep -q "warning: .*--shm_dir=/dev/shm" <<<"$out" ||
  fail "install.sh kept a flag file with another --shm_dir without a warning: $out"
echo "ok: the flags' socket, banks and journals are the unit's folders; install.sh warns of a kept --shm_dir elsewhere"
echo "PASS"
