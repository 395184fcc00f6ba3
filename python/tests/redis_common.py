"""What the Redis helpers of the tests and benchmarks share, free of pytest
(redis_cluster.py is a pytest fixture, netns_redis.py also serves
python/bench): the daemons' ACL, finding Redis's tools, and the cluster key
file kvtierd reads.

Thread-safety: stateless functions.
"""

from __future__ import annotations

import os
import secrets
import shutil

# kvtierd's ACL after the user's name, password and key pattern: the C++
# fixture's kDaemonAcl (tests/redis_cluster_fixture.h).
ACL = "resetchannels -@all +get +set +exists +del +asking +cluster|slots"


def which(name: str) -> str | None:
    """The path of `name` (redis-server, redis-cli, redis-benchmark) on PATH
    or in /usr/bin, /usr/sbin; None when it is nowhere."""
    return shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/usr/sbin/{name}") if os.access(p, os.X_OK)),
        None)


def key_file(path) -> str:
    """Writes a cluster key (kvtierd --cluster_key_file) to `path`: 32
    random bytes as 64 hex digits (the daemon drops a trailing newline,
    which random bytes could end with), mode 0600, owned by this uid, which
    runs the daemons. Returns the path as a str."""
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return str(path)
