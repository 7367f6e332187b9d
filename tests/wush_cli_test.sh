#!/usr/bin/env bash
# driftkv-calibrate and driftkv-codec --transform end to end:
# deterministic transforms file of the documented size, eval/encode/decode
# with WUSH, pools that record their transform, and clear messages on bad
# input.
#   wush_cli_test.sh CALIBRATE CODEC SYNTH
set -euo pipefail
cal=$1
codec=$2
synth=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

shape=2,256,2,64
for s in 1 2 3; do
  "$synth" --out "$tmp/s$s" --layers 2 --tokens 256 --kv-heads 2 --head-dim 64 --query-tokens 64 --seed $s >/dev/null
done
args=(--keys "$tmp/s1.k" --values "$tmp/s1.v" --queries "$tmp/s1.q"
      --keys "$tmp/s2.k" --values "$tmp/s2.v" --queries "$tmp/s2.q" --shape $shape --q-heads 4)
"$cal" "${args[@]}" --out "$tmp/a.xfm" 2>/dev/null
"$cal" "${args[@]}" --out "$tmp/b.xfm" 2>/dev/null
cmp -s "$tmp/a.xfm" "$tmp/b.xfm" || fail "calibration is not deterministic"
size=$(stat -c %s "$tmp/a.xfm")
[ "$size" = $((56 + 16 * 2 * 2 * 64 * 64)) ] || fail "transforms file is $size bytes"
[ "$(head -c 7 "$tmp/a.xfm")" = "DKVXFRM" ] || fail "magic"

# Bad input: wrong shape, unequal triples, missing queries statistics.
msg=$("$cal" --keys "$tmp/s1.k" --values "$tmp/s1.v" --queries "$tmp/s1.q" --shape 2,255,2,64 --q-heads 4 \
  --out "$tmp/x" 2>&1) && fail "wrong shape accepted"
grep -q "bytes; --shape 2,255,2,64" <<<"$msg" || fail "shape message: $msg"
msg=$("$cal" --keys "$tmp/s1.k" --values "$tmp/s1.v" --shape $shape --q-heads 4 --out "$tmp/x" 2>&1) &&
  fail "missing --queries accepted"
grep -q "need as many --keys, --values and --queries" <<<"$msg" || fail "triple message: $msg"
msg=$("$cal" --keys "$tmp/nope.k" --values "$tmp/s1.v" --queries "$tmp/s1.q" --shape $shape --q-heads 4 \
  --out "$tmp/x" 2>&1) && fail "missing file accepted"
grep -q "cannot open $tmp/nope.k" <<<"$msg" || fail "missing file message: $msg"
msg=$("$cal" "${args[@]}" --wo "$tmp/s1.k" --hidden 3 --out "$tmp/x" 2>&1) && fail "bad W_O accepted"
grep -q "\[L\]\[E\]\[N\*D\] needs" <<<"$msg" || fail "W_O message: $msg"

# eval / encode / decode through the transform.
ev=(--keys "$tmp/s3.k" --values "$tmp/s3.v" --shape $shape --codec int --bits 2)
out=$("$codec" eval "${ev[@]}" --queries "$tmp/s3.q" --q-heads 4 --transform wush --transforms "$tmp/a.xfm" --json)
grep -q '"attn_rel_err"' <<<"$out" || fail "eval output: $out"
# --values-folded: eval folds the model's values itself (v' = T_V v) and
# measures in the model's domain, so nmse_v and attn_rel_err are those of
# the unfolded transform up to float rounding (not those of unrotated values).
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" <<<"$2"; }
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4 * b) }'; }
for c in "int --bits 2" dquant; do
  # shellcheck disable=SC2086
  un=$("$codec" eval "${ev[@]:0:6}" --codec $c --queries "$tmp/s3.q" --q-heads 4 --transform wush \
    --transforms "$tmp/a.xfm" --json)
  # shellcheck disable=SC2086
  fo=$("$codec" eval "${ev[@]:0:6}" --codec $c --queries "$tmp/s3.q" --q-heads 4 --transform wush \
    --transforms "$tmp/a.xfm" --values-folded --json)
  for key in nmse_k nmse_v attn_rel_err; do
    close "$(field $key "$fo")" "$(field $key "$un")" || fail "$c --values-folded $key: $fo vs unfolded $un"
  done
done
"$codec" encode "${ev[@]}" --transform wush --transforms "$tmp/a.xfm" --out "$tmp/p" 2>/dev/null
"$codec" decode --in "$tmp/p" --out "$tmp/d" --transform wush --transforms "$tmp/a.xfm" 2>/dev/null
[ -s "$tmp/d.k" ] || fail "decode wrote nothing"
msg=$("$codec" decode --in "$tmp/p" --out "$tmp/d" --transform hadamard 2>&1) && fail "mismatched decode accepted"
grep -q "does not match the pool's rotation identity" <<<"$msg" || fail "decode message: $msg"

# The pool records its transform (kind, layer, values_folded, the transforms
# file's checksum); decode insists on the same file and takes the rest from it.
"$cal" --keys "$tmp/s3.k" --values "$tmp/s3.v" --queries "$tmp/s3.q" --shape $shape --q-heads 4 \
  --out "$tmp/c.xfm" 2>/dev/null
fnv_a=$(tail -c 8 "$tmp/a.xfm" | od -An -tx8 | tr -d ' \n')
fnv_c=$(tail -c 8 "$tmp/c.xfm" | od -An -tx8 | tr -d ' \n')
[ "$fnv_a" != "$fnv_c" ] || fail "two calibrations share a checksum"
"$codec" encode "${ev[@]}" --transform wush --transforms "$tmp/a.xfm" --layer 1 --values-folded \
  --out "$tmp/pf" 2>/dev/null
grep -aq "transform=wush transform_layer=1 values_folded=1 transforms_fnv=$fnv_a" "$tmp/pf" ||
  fail "pool options: $(head -c 600 "$tmp/pf" | tail -c 472 | tr -d '\0')"
grep -aq "transform=wush transform_layer=-1 values_folded=0 transforms_fnv=$fnv_a" "$tmp/p" ||
  fail "pool options without --layer: $(head -c 600 "$tmp/p" | tail -c 472 | tr -d '\0')"
msg=$("$codec" decode --in "$tmp/pf" --out "$tmp/df" 2>&1) && fail "wush pool decoded without --transforms"
grep -q "encoded with --transform wush (transforms file checksum $fnv_a); decode it with --transform wush --transforms FILE" \
  <<<"$msg" || fail "no-transforms message: $msg"
msg=$("$codec" decode --in "$tmp/pf" --out "$tmp/df" --transform identity 2>&1) && fail "identity decode of a wush pool accepted"
grep -q "encoded with --transform wush" <<<"$msg" || fail "identity message: $msg"
msg=$("$codec" decode --in "$tmp/pf" --out "$tmp/df" --transform wush --transforms "$tmp/c.xfm" 2>&1) &&
  fail "other transforms file accepted"
grep -q -- "--transforms $tmp/c.xfm has checksum $fnv_c but the pool was encoded with transforms of checksum $fnv_a" \
  <<<"$msg" || fail "checksum message: $msg"
msg=$("$codec" decode --in "$tmp/pf" --out "$tmp/df" --transform wush --transforms "$tmp/a.xfm" --layer 0 2>&1) &&
  fail "other --layer accepted"
grep -q -- "--layer 0 differs from the pool's transform_layer 1" <<<"$msg" || fail "layer mismatch message: $msg"
msg=$("$codec" decode --in "$tmp/p" --out "$tmp/df" --transform wush --transforms "$tmp/a.xfm" --values-folded 2>&1) &&
  fail "--values-folded accepted for transformed values"
grep -q "values were encoded transformed" <<<"$msg" || fail "folded mismatch message: $msg"
# Layer and folding come from the pool: the same output as when given.
"$codec" decode --in "$tmp/pf" --out "$tmp/df" --transform wush --transforms "$tmp/a.xfm" 2>/dev/null
"$codec" decode --in "$tmp/pf" --out "$tmp/dg" --transform wush --transforms "$tmp/a.xfm" --layer 1 --values-folded 2>/dev/null
cmp -s "$tmp/df.k" "$tmp/dg.k" && cmp -s "$tmp/df.v" "$tmp/dg.v" || fail "decode without --layer/--values-folded differs"
"$codec" decode --in "$tmp/pf" --out "$tmp/dh" --transform wush --transforms "$tmp/a.xfm" --layer 1 2>/dev/null
cmp -s "$tmp/df.v" "$tmp/dh.v" || fail "folded values not taken from the pool"
cmp -s "$tmp/df.k" "$tmp/d.k" && fail "layer 1 decode equals the per-layer decode"

msg=$("$codec" eval "${ev[@]}" --transform wush 2>&1) && fail "wush without file accepted"
grep -q "needs --transforms FILE" <<<"$msg" || fail "message: $msg"
msg=$("$codec" eval "${ev[@]}" --transform wush --transforms "$tmp/a.xfm" --layer 2 2>&1) && fail "bad layer accepted"
grep -q "out of range \[0, 2)" <<<"$msg" || fail "layer message: $msg"
head -c 1000 "$tmp/a.xfm" >"$tmp/cut.xfm"
msg=$("$codec" eval "${ev[@]}" --transform wush --transforms "$tmp/cut.xfm" 2>&1) && fail "truncated file accepted"
grep -q "needs" <<<"$msg" || fail "truncation message: $msg"
"$codec" sweep --codec int "${ev[@]:0:6}" --queries "$tmp/s3.q" --q-heads 4 --transform wush \
  --transforms "$tmp/a.xfm" --out "$tmp/sweep" --no-plot 2>/dev/null
[ "$(grep -c '^data,int,' "$tmp/sweep/sweep.csv")" -ge 5 ] || fail "sweep rows: $(cat "$tmp/sweep/sweep.csv")"
echo "PASS"
