# Sourced by the device scripts: B, the bundle's launcher, and
# `gtest NAME SECONDS`, which runs a bundled test binary with its log in
# $OUT/NAME.log and prints its exit status and verdict lines.
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
