#!/usr/bin/env bash
# (bench/device/README.md: how to bundle what it runs)
# Where an attention kernel's instructions go: the SASS of KERNEL
# (default LevelAttentionKernel, the hot tier's; DQuantAttentionKernel is
# the cold pages') by cuobjdump and ncu's per-instruction execution counts
# (SourceCounters) of one launch at SHAPE (64x8192), as a CSV that
# docs/hot_tier/sass_profile.py sums by opcode and by how often each
# instruction ran, then the pipes' utilisation and the stall reasons. BIN
# (bench_gpu); SKIP (3): the launches of KERNEL skipped before the one profiled,
# REPS (5) bench_gpu's --reps (which moves them: with REPS=3 SHAPE=1x8192
# PromoteKernel's launches from the tenth on promote 2048 pages: SKIP=10).
set -uo pipefail
. bench/device/gtest.sh
bin=${BIN:-bench_gpu}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
path=.device/bundle/bin/$bin
k=${KERNEL:-LevelAttentionKernel}
cuobjdump -sass "$path" 2>&1 | awk -v k="$k" '/Function : /{p = index($0, k) > 0} p' > $OUT/sass_$bin.txt
wc -l $OUT/sass_$bin.txt
timeout 300 ncu --clock-control none --kernel-name regex:$k --launch-skip ${SKIP:-3} --launch-count 1 \
  --section SourceCounters --section InstructionStats --section WarpStateStats --section LaunchStats \
  --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis -o $OUT/prof_$bin \
  $B $bin --encode_tokens=0 --shapes=${SHAPE:-64x8192} --reps=${REPS:-5} > $OUT/ncu_run_$bin.log 2>&1
tail -3 $OUT/ncu_run_$bin.log
ncu -i $OUT/prof_$bin.ncu-rep --page details > $OUT/details_$bin.txt 2>&1
ncu -i $OUT/prof_$bin.ncu-rep --page source --csv --print-source sass > $OUT/source_$bin.csv 2>&1
wc -l $OUT/source_$bin.csv; head -3 $OUT/source_$bin.csv | cut -c1-400
grep -E "Duration|DRAM Throughput|Executed Ipc|Issue Slots|Registers|Achieved Occupancy|Stall" $OUT/details_$bin.txt | head -30
# Each pipe's share of its peak (the ALU, the FMA pipes, fp16, tensor,
# shared memory) and the warps' stall reasons, per issued instruction.
ncu -i $OUT/prof_$bin.ncu-rep --page raw > $OUT/raw_$bin.txt 2>&1
grep -E "sm__inst_executed_pipe_[a-z0-9_]+\.avg\.pct_of_peak_sustained_active|sm__pipe_[a-z0-9_]+_cycles_active\.avg\.pct|smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active\.ratio" \
  $OUT/raw_$bin.txt | awk '$NF+0 > 0.02' | head -60
