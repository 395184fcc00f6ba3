"""perf's view of a cluster_prefetch run (python/bench/cluster_prefetch.py):
`perf record` of B's kvtierd, or of the whole machine, during one
prefetch, and the shares of its samples by label, DSO, symbol and (for the
whole machine) command.

Thread-safety: plain functions; each runs perf as a child process.
"""

import re
import subprocess

# Where B's kvtierd spends its samples during a prefetch (perf --children:
# a function with everything it calls), by label: a regex of perf's symbol.
PERF_SHARES = {
    "prefetch job (TierCore::RunPrefetch)": r"TierCore::RunPrefetch$",
    "fetch (RedisCluster::Get)": r"RedisCluster::Get$",
    "socket reads (RedisCluster::ReadReplies)": r"RedisCluster::ReadReplies$",
    "readv into the arena (RespReader::ReadFrom)": r"RespReader::ReadFrom$",
    "verify (DecodeClusterValue: HMAC-SHA256)": r"DecodeClusterValue$",
    "page faults": r"\[k\] asm_exc_page_fault$",
    "glibc heap trim (madvise)": r"heap_trim \(inlined\)$",
    "tcp_recvmsg": r"\[k\] tcp_recvmsg$",
}


def perf_record(pid: int | None, out: str) -> subprocess.Popen:
    """Starts perf record (call graphs) of `pid`, or of every CPU (None)."""
    target = ["-p", str(pid)] if pid is not None else ["-a"]
    return subprocess.Popen(["perf", "record", "-q", "-F", "499", "--call-graph",
                             "dwarf,16384", *target, "-o", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_report(data: str, children: str, sort: str) -> list[str]:
    return subprocess.run(["perf", "report", "-i", data, "--stdio", children, "--sort",
                           sort, "-g", "none"], capture_output=True, text=True,
                          timeout=600).stdout.splitlines()


def perf_shares(data: str) -> dict:
    shares = {}
    for line in perf_report(data, "--children", "sym"):
        m = re.match(r"\s*([\d.]+)%\s+[\d.]+%\s+(.*\S)", line)
        if not m:
            continue
        for label, rx in PERF_SHARES.items():
            if re.search(rx, m.group(2)):
                shares[label] = max(shares.get(label, 0.0), float(m.group(1)))
    by_dso = {}
    for line in perf_report(data, "--no-children", "dso"):
        m = re.match(r"\s*([\d.]+)%\s+(\S+)", line)
        if m and float(m.group(1)) >= 0.5:
            by_dso[m.group(2)] = float(m.group(1))
    by_sym = {}
    for line in perf_report(data, "--no-children", "sym"):
        m = re.match(r"\s*([\d.]+)%\s+(.*\S)", line)
        # libcrypto has no symbols: its addresses are in self_percent_by_dso.
        if m and float(m.group(1)) >= 1.0 and "] 0x" not in m.group(2):
            by_sym[m.group(2)] = float(m.group(1))
    by_comm = {}
    for line in perf_report(data, "--no-children", "comm"):
        m = re.match(r"\s*([\d.]+)%\s+(.*\S)", line)
        if m and float(m.group(1)) >= 0.5:
            by_comm[m.group(2)] = float(m.group(1))
    return {"percent_of_samples_with_callees": shares, "self_percent_by_dso": by_dso,
            "self_percent_by_symbol": by_sym, "self_percent_by_command": by_comm}
