#!/usr/bin/env bash
# `driftkv-codec sweep` end to end on synth-kv data: one command gives a CSV
# with a row for every codec and its tagged operating points, and the
# matched-storage `fixed` points never use more storage than their dquant
# point. Plotting is skipped (--no-plot): CI has no matplotlib.
set -euo pipefail
cli="$1"
synth="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

flags=$("$synth" --kind llm --out "$tmp/kv" --layers 1 --tokens 160 --query-tokens 8 \
        --kv-heads 2 --head-dim 64)
# shellcheck disable=SC2086
"$cli" sweep $flags --out "$tmp/sweep" --no-plot --label tiny --jobs 2
csv="$tmp/sweep/sweep.csv"
[ -s "$csv" ] || fail "no $csv"
head -1 "$csv" | grep -q '^label,codec,config,tag,key_levels,value_levels,bits_k,bits_v,bits,nmse_k,nmse_v,attn_rel_err' \
  || fail "CSV header: $(head -1 "$csv")"
for codec in dquant int kivi oscar turbo fixed fp8 bf16; do
  grep -q "^tiny,$codec," "$csv" || fail "no $codec row"
done
python3 - "$csv" <<'PY' || fail "CSV content"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {(r["codec"], r["tag"]): r for r in rows}
for tag in ("default", "b1.96"):
    d, f = by[("dquant", tag)], by[("fixed", "matched-" + tag)]
    assert float(f["bits_k"]) <= float(d["bits_k"]) + 1e-9, (tag, f["bits_k"], d["bits_k"])
    assert float(f["bits_v"]) <= float(d["bits_v"]) + 1e-9, (tag, f["bits_v"], d["bits_v"])
assert abs(float(by[("int", "default")]["bits"]) - 2.25) < 1e-9
for r in rows:
    for k in ("nmse_k", "nmse_v", "attn_rel_err"):
        assert 0 <= float(r[k]) < 10, (r["codec"], r["config"], k, r[k])
PY

# Bad input: an unknown codec is an error naming it.
if "$cli" sweep $flags --out "$tmp/bad" --no-plot --codec nope 2>"$tmp/err"; then
  fail "unknown codec accepted"
fi
grep -q 'unknown codec "nope"' "$tmp/err" || fail "message: $(cat "$tmp/err")"
echo PASS
