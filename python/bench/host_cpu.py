"""CPU figures of the machine and of processes, from /proc, for the
benchmarks (python/bench/cluster_prefetch.py): the machine's CPU time split
into busy, softirq and idle, the hypervisor's steal, children's CPU, and a
process's and its threads' CPU and page faults.

Thread-safety: plain functions.
"""

import os
import resource


def cpu_times() -> list[int]:
    """/proc/stat's "cpu" line: user nice system idle iowait irq softirq steal."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def steal_percent(before: list[int], after: list[int]) -> float:
    """The share of CPU time the hypervisor gave others (noise on a VM)."""
    d = [a - b for a, b in zip(after, before)]
    return round(100.0 * d[7] / max(1, sum(d)), 2)


def cpu_split(before: list[int], after: list[int]) -> dict:
    """CPU-seconds of the whole machine between two cpu_times(): busy (all
    but idle and iowait), of it softirq (the network stack), and idle."""
    d = [(a - b) / os.sysconf("SC_CLK_TCK") for a, b in zip(after, before)]
    return {"busy": round(sum(d) - d[3] - d[4], 2), "softirq": round(d[6], 2),
            "idle": round(d[3] + d[4], 2)}


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def thread_cpu(pid: int) -> dict:
    """{"name/tid": CPU seconds} of every thread of process `pid`."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[f"{name}/{tid}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat past the command name (the process: exited threads
    included)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_cpu(pid: int) -> float:
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
