#!/usr/bin/env bash
# Installs the Debian packages kvtier builds and tests with, only those missing.
# Used by `make deps` (and so by `make run` and `make test`). Needs root or sudo
# when something is missing; does nothing at all when everything is present.
set -euo pipefail
pkgs=(
  cmake make g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libboost-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libssl-dev libxxhash-dev libsystemd-dev
  libisal-dev  # common/crc32c: ISA-L's CRC-32C (journal, fence registry)
  prometheus-cpp-dev systemd  # kvtierd's /metrics; systemd-analyze (deploy_test)
  python3 python3-venv  # make pydeps: the venv of python/requirements.txt
  clang libclang-rt-14-dev passwd  # test-asan + fuzz/; useradd (isolation)
  libseccomp-dev  # tests/seccomp_exec: the unit's SystemCallFilter= in CI
  curl dpkg-dev  # Debian source packages: scripts/pic-deps.sh, scripts/tsan-abseil.sh
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev  # KV events (daemon/kv_events.h)
  # The cluster tier (issue 17): hiredis for the client, redis-server and
  # redis-tools (redis-cli --cluster) for the tests' real Redis Cluster,
  # iproute2 for their network namespaces.
  libhiredis-dev redis-server redis-tools iproute2
  # tests/socket_birth_test: kvtierd under strace's delayed chmods (issue 27),
  # setpriv (util-linux) to run it and the racer as other users.
  strace util-linux
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
