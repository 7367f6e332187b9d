# Sourced by trace.sh and grpc_experiments.sh (after gtest.sh).
# `traced_run TAG SERVER PATH [VAR=value+...]`: one fresh SERVER
# (a bundled name) with DRIFTKV_ATTEND_TRACE and the extra environment,
# 8 layers x 64 x 8192, STEPS (100) steps of PATH without a decode step
# after a host-shm prefill, the client writing its own times; the run's
# lines and trace_join.py's split appended to $OUT/ab.log. CONF (default
# dp_server_poll.textproto) and POLL (1: the client polls) pick the door;
# the sleeping door keeps no trace, so its runs have no split.
traced_run() {
  local tag=$1 server=$2 path=$3 extra=${4:-}
  SERVER=$server SERVER_ENV="${extra:+$extra+}DRIFTKV_ATTEND_TRACE=$OUT/server_$tag.csv" \
    CONF=${CONF:-dp_server_poll.textproto} \
    BENCH_ARGS="--read_chunk_bytes=1048576 --poll_attend=${POLL:-1} --trace_calls=$OUT/client_$tag.csv" \
    SHAPE="--layers=8 --sequences=64 --context=8192" PREFILL_PATH=shm_doorbell PREFILL_STEPS=3 \
    STEPS=${STEPS:-100} PATHS="$path:0" \
    bash bench/device/phases.sh 2>&1 | cut -c1-300 | tee -a $OUT/ab.log
  [ -f $OUT/server_$tag.csv ] &&
    python3 bench/device/trace_join.py $OUT/server_$tag.csv $OUT/client_$tag.csv $tag | tee -a $OUT/ab.log
}
# `rotated ROUNDS FN VARIANT...`: ROUNDS rounds of FN ROUND VARIANT for
# every variant, the order rotated by one each round; ROUND_FROM (1) numbers
# the first (a second call goes on with the next rotation).
rotated() {
  local rounds=$1 fn=$2 r k from=${ROUND_FROM:-1}
  shift 2
  local variants=("$@") n=$#
  for r in $(seq $from $((from + rounds - 1))); do
    for k in $(seq 0 $((n - 1))); do
      $fn $r ${variants[$(((k + r - 1) % n))]}
    done
  done
}
# The traces as one archive (the device returns few files).
archive_traces() {
  (cd $OUT && ls server_*.csv client_*.csv 2>/dev/null | xargs -r tar czf traces.tgz && rm -f server_*.csv client_*.csv)
}
