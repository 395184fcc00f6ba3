#!/usr/bin/env python3
"""Judges the ThreadSanitizer reports of `make test-tsan` (issue 15).

Every TSan-instrumented process of the run writes its reports to
LOG_DIR/report.<pid> (TSAN_OPTIONS log_path). This fails (exit 1, printing
them) on any report, except a data race that lies wholly inside gRPC.

Why the exception: gRPC is Debian's and not instrumented, but half of its
C++ callback API is inline code (grpcpp headers) compiled into our binaries,
hence instrumented. gRPC hands each call between its threads through the
uninstrumented half (combiners, ref counts, lock-free queues), so TSan sees
the call's fields written on one thread and read on another with nothing
between. TSan's own suppressions cannot single these out: a race: entry
matches any frame of either stack, and gRPC's frames sit below every
reactor method of the daemon too. The rule here is narrower: a race is
gRPC's when, in both of its accesses, the innermost frame that is not a
libstdc++ or abseil helper, nor an intercepted libc call, is gRPC's (or
protobuf's) code. A race in which either access is made by the project's
own code (daemon/, client/, shm/, tests/, ...) fails the run.

A report cut short because its process was killed while TSan was writing
it (the tests SIGKILL daemons and engines on purpose) has no SUMMARY line;
when what survives of it names no frame of the project's, there is nothing
to judge: it is counted and printed, not failed. One that names a project
frame fails like any other.

Usage: tsan_reports.py LOG_DIR
"""
import collections
import glob
import os
import re
import sys

FRAME = re.compile(
    r"^\s+#\d+ (?P<func>.*?) (?P<file>/\S+|<null>) \((?P<module>[^+)]+)")
THIRD_PARTY_MODULE = re.compile(r"^lib(grpc|gpr|protobuf|upb|address_sorting)")
THIRD_PARTY_HEADERS = re.compile(r"^/usr/include/(grpcpp|grpc|grpc\+\+|google/protobuf)/")
THIRD_PARTY_FUNC = re.compile(r"^(\S+ )?(grpc|grpc_core|google::protobuf)::|^grpc_|^upb_")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def owner(stack_lines):
    """'grpc', 'project' or 'unknown': whose code makes this stack's access.

    Walks from the innermost frame; libstdc++, abseil, libc and the
    interceptors (memcpy, operator new, ...) are helpers, skipped.
    """
    for line in stack_lines:
        m = FRAME.match(line)
        if not m:
            continue
        func, path, module = m.group("func"), m.group("file"), m.group("module")
        path = os.path.normpath(path) if path != "<null>" else ""
        if THIRD_PARTY_MODULE.match(module) or THIRD_PARTY_HEADERS.match(path):
            return "grpc"
        if path.startswith(ROOT + "/") and "/abseil-tsan/" not in path:
            return "project"
        if THIRD_PARTY_FUNC.match(func):
            return "grpc"
    return "unknown"


def main():
    log_dir = sys.argv[1]
    failures, ignored, truncated = [], collections.Counter(), []
    for path in sorted(glob.glob(os.path.join(log_dir, "report.*"))):
        text = open(path, errors="replace").read()
        for report in text.split("==================\n"):
            if "WARNING: ThreadSanitizer" not in report:
                continue
            if "SUMMARY: ThreadSanitizer" not in report:
                # Cut short by the process's death (see the docstring).
                frames = [l for l in report.splitlines() if FRAME.match(l)]
                if owner(frames) != "project" and not any(
                        FRAME.match(l).group("file").startswith(ROOT + "/")
                        and "/abseil-tsan/" not in l for l in frames):
                    truncated.append((path, report))
                    continue
            if "WARNING: ThreadSanitizer: data race" in report:
                # The two accesses: "Write of size..." / "Previous read...".
                blocks = re.split(r"\n  (?=[A-Z])", report)
                accesses = [b.splitlines() for b in blocks[1:3]]
                owners = [owner(a) for a in accesses]
                if owners == ["grpc", "grpc"]:
                    funcs = [FRAME.match(l).group("func") for l in accesses[0]
                             if FRAME.match(l)]
                    first = next((f for f in funcs if THIRD_PARTY_FUNC.match(f)),
                                 funcs[0] if funcs else "?")
                    ignored[first[:100]] += 1
                    continue
            failures.append((path, report))
    if ignored:
        print(f"tsan: {sum(ignored.values())} races inside gRPC's own code ignored "
              f"(tests/tsan_reports.py), by gRPC function:")
        for func, n in ignored.most_common():
            print(f"  {n:4d}  {func}")
    for path, report in truncated:
        print(f"tsan: a report cut short by its process's death, with no "
              f"project frame to judge ({path}):\n{report.strip()}")
    for path, report in failures:
        print(f"=== TSan report ({path}):\n{report}")
    if failures:
        print(f"tsan: {len(failures)} reports")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
