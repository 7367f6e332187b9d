#!/usr/bin/env bash
# Runs every fuzz target of BIN_DIR (fuzz/build.sh's output) in parallel,
# WORKERS processes each, for at most SECONDS or RUNS executions per
# process, from the committed seeds (fuzz/corpus/TARGET) into a scratch
# corpus. Prints one line per target (executions, exec/s, new corpus
# entries) and exits 1 if any target crashed, leaked or timed out (its
# reproducer is left in WORK/TARGET/crash-*; fix the bug, then add the file
# to fuzz/corpus/TARGET).
#
#   fuzz/run.sh BIN_DIR SECONDS [RUNS [WORKERS [WORK [TARGET=N,...]]]]
# RUNS is the total per target, split over its workers; the last argument
# gives some targets another number of workers.
set -uo pipefail
BIN="$(cd "$1" && pwd)"
SECONDS_EACH="$2"
RUNS="${3:--1}"
WORKERS="${4:-1}"
WORK="${5:-$(mktemp -d)}"
OVERRIDES=",${6:-},"
CORPUS="$(cd "$(dirname "$0")" && pwd)/corpus"
mkdir -p "$WORK"
start=$(date +%s.%N)
for bin in "$BIN"/fuzz_*; do
  name=$(basename "$bin")
  mkdir -p "$WORK/$name"
  workers=$WORKERS
  [[ "$OVERRIDES" =~ ,$name=([0-9]+), ]] && workers=${BASH_REMATCH[1]}
  runs=$RUNS
  ((RUNS > 0)) && runs=$(((RUNS + workers - 1) / workers))
  for w in $(seq 1 "$workers"); do
    mkdir -p "$WORK/$name/corpus$w"
    "$bin" -runs="$runs" -max_total_time="$SECONDS_EACH" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$WORK/$name/" "$WORK/$name/corpus$w" "$CORPUS/$name" \
      >"$WORK/$name/log$w" 2>&1 &
  done
done
failed=0
for job in $(jobs -p); do wait "$job" || failed=1; done
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
printf '%-18s %12s %10s %8s  %s\n' target executions exec/s corpus result
for dir in "$WORK"/fuzz_*; do
  name=$(basename "$dir")
  execs=0 secs=0 result=clean
  for log in "$dir"/log*; do
    e=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
    execs=$((execs + ${e:-0}))
    if grep -qE 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: UndefinedBehavior' "$log"; then
      result="CRASH ($log)"
    fi
  done
  corpus=$(cat "$dir"/corpus*/* 2>/dev/null | wc -c)
  new=$(find "$dir" -path '*/corpus*' -type f | wc -l)
  printf '%-18s %12d %10.0f %8d  %s\n' "$name" "$execs" "$(awk -v e="$execs" -v s="$elapsed" 'BEGIN { print e / s }')" "$new" "$result"
  [[ "$result" == clean ]] || failed=1
done
echo "fuzz: $WORKERS worker(s) per target (overrides: ${6:-none}), ${elapsed}s wall"
exit $failed
