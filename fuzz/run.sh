#!/usr/bin/env bash
# Runs one libFuzzer harness for a bounded time and prints one summary line:
#   FUZZ <name> seconds=S runs=N corpus=C crashes=0|1
# Usage: fuzz/run.sh HARNESS WORK_DIR SECONDS
# The corpus grows in WORK_DIR/corpus/<name> across runs; a crashing input
# lands in WORK_DIR/artifacts/ and the script exits non-zero.
# Inputs are programs of operations (see the harnesses), so they start at
# full length (-len_control=0) rather than growing from a few bytes: a
# minute is too short to climb that way.
set -uo pipefail
harness=$1 work=$2 seconds=$3
name=$(basename "$harness")
mkdir -p "$work/corpus/$name" "$work/artifacts"
log="$work/$name.log"
"$harness" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
  -max_len=1024 -len_control=0 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/$name-" "$work/corpus/$name" >"$log" 2>&1
rc=$?
runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
corpus=$(ls "$work/corpus/$name" | wc -l)
crashes=0
[ $rc -eq 0 ] || crashes=1
echo "FUZZ $name seconds=$seconds runs=${runs:-0} corpus=$corpus crashes=$crashes"
if [ $rc -ne 0 ]; then
  tail -60 "$log"
fi
exit $rc
