# Sourced by the device scripts: B, the bundle's launcher, and
# `gtest NAME SECONDS`, which runs a bundled test binary with its log in
# $OUT/NAME.log and prints its exit status and verdict lines (and
# gtests, bench_vs_sdpa, promotion_gate, ncu_promote and promotion_round
# below).
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
# `promotion_gate TEST`: four cases of a bundled level_attention_test build
# (each checks its promotion byte for byte against the CPU's), log
# $OUT/TEST.log; returns 0 when they passed: a promotion variant's gate.
promotion_gate() {
  timeout 100 $B $1 --gtest_filter='*Gqa32x8Dim128*:*Gqa8x4Dim64*:*Gqa8x4Dim128AndGqa32x8Dim64*:*LargeAndTiny*' \
    > $OUT/$1.log 2>&1
  grep -E "PASSED|FAILED|worst error" $OUT/$1.log | tail -3
  grep -q "PASSED" $OUT/$1.log && ! grep -q FAILED $OUT/$1.log
}
# `ncu_promote BUILD`: ncu's time, instructions, issue rate, registers,
# occupancy limit and shared-memory wavefronts of one 2048-page
# PromoteKernel launch of a bundled bench_gpu build (with --reps=3 at
# 1 x 8K the launches from the tenth on promote 2048 pages); log
# $OUT/ncu_promote_BUILD.log.
ncu_promote() {
  echo "== ncu PromoteKernel, one 2048-page launch: $1"
  timeout 60 ncu --clock-control none --kernel-name regex:PromoteKernel --launch-skip 10 --launch-count 1 \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__inst_executed.avg.per_cycle_active,launch__registers_per_thread,launch__occupancy_limit_registers,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum \
    $B $1 --encode_tokens=0 --shapes=1x8192 --reps=3 > $OUT/ncu_promote_$1.log 2>&1
  grep -E "\(2048|gpu__time|inst_executed|registers|occupancy|bank|wavefronts|ERR" $OUT/ncu_promote_$1.log | head -9
}
# `promotion_round ROUND BUILD...`: each bundled bench_gpu build's
# promotion and checked-promotion lines at 1 x 8K (2048 pages), in turn;
# logs $OUT/BUILD_pROUND.log.
promotion_round() {
  local round=$1 v
  shift
  for v in "$@"; do
    timeout 60 $B $v --encode_tokens=0 --shapes=1x8192 > $OUT/${v}_p$round.log 2>&1
    echo "round $round $v: $(grep -E '^Promotion' $OUT/${v}_p$round.log | sed 's/.*: //')"
    grep -E "^Checksums" $OUT/${v}_p$round.log | sed 's/.*promotion (/  checked (/'
  done
}
