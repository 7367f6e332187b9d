# Sourced by the device scripts: B, the bundle's launcher, and
# `gtest NAME SECONDS`, which runs a bundled test binary with its log in
# $OUT/NAME.log and prints its exit status and verdict lines (and
# gtests, bench_vs_sdpa below).
B=.device/bundle/run
gtest() {
  echo "== $1"; timeout $2 $B $1 > $OUT/$1.log 2>&1; echo "rc=$?"; grep -E "PASSED|FAILED|skipped|Failure" $OUT/$1.log | tail -6
}
# `gtests NAME:SECONDS ...`: each through gtest; returns 1 (after all ran)
# when any failed: measurements of a build that fails its tests are worth
# nothing.
gtests() {
  local failed=0 t
  for t in "$@"; do
    gtest ${t%:*} ${t#*:}
    grep -q "FAILED" $OUT/${t%:*}.log && failed=1
  done
  [ $failed = 0 ] || echo "a GPU test failed: no measurements"
  return $failed
}
# `bench_vs_sdpa NAME ROUND SECONDS [ARGS...]`: one run of the bundled
# bench_gpu build NAME (ARGS added), its hot lines, then PyTorch SDPA on
# the same shapes right after it and the table of both; files
# $OUT/{NAME_ROUND.log,.csv}, sdpa_NAME_ROUND.log, table_NAME_ROUND.md.
bench_vs_sdpa() {
  local v=$1 round=$2 secs=$3
  shift 3
  timeout $secs $B $v --encode_tokens=0 "$@" --csv=$OUT/${v}_$round.csv > $OUT/${v}_$round.log 2>&1
  grep -A8 "hot ms" $OUT/${v}_$round.log | head -8
  timeout $secs python3 bench/sdpa_bench.py --cxx $OUT/${v}_$round.csv --out $OUT/table_${v}_$round.md \
    > $OUT/sdpa_${v}_$round.log 2>&1
  cat $OUT/table_${v}_$round.md
}
