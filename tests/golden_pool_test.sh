#!/usr/bin/env bash
# Golden pool files: what `driftkv-codec encode` writes must not change
# (same records for the same inputs and flags), and what `decode` returns
# for them must not change either. The files in tests/testdata/ were written
# with the commands below before the restructuring of the source tree; a
# refactoring that changes one byte fails here. Those two were written with
# the least-squares value grid, the default then: `--v-refit least_squares`
# must still write them. The *_unbiased files were written with the
# default since ("unbiased", codec/stream_codec.h step 6) by the same
# commands without --v-refit.
#
# They are pool files of version 1 (key_bytes=0 value_bytes=0 in their
# options, 40 and 25 bytes as their writer resolved them); encode now
# writes version 2, which records the resolved payload sizes
# (codec/pool_file.h "Versions"), and n = 128 now defaults to 48 and 36
# bytes (docs/api.md "Default containers"). A fresh file written with
# --k-bytes 40 --v-bytes 25 must therefore equal its golden one in every
# byte but the version and the options text (and the options' length), and
# decode to the same floats. The file of today's defaults is pinned by its
# SHA-256 (recorded when the defaults changed).
#
#   synth-kv --out s --layers 2 --tokens 300 --kv-heads 2 --head-dim 64 --query-tokens 16 --seed 7
#   synth-kv --out c --layers 2 --tokens 256 --kv-heads 2 --head-dim 64 --query-tokens 64 --seed 8
#   driftkv-calibrate --keys c.k --values c.v --queries c.q --shape 2,256,2,64 --q-heads 4 --out c.xfm
#   driftkv-codec encode --keys s.k --values s.v --shape 2,300,2,64 --residual 44 \
#       --out golden_dquant.dkv
#   driftkv-codec encode --keys s.k --values s.v --shape 2,300,2,64 --residual 44 \
#       --transform wush --transforms c.xfm --out golden_wush.dkv
#
#   golden_pool_test.sh SYNTH CALIBRATE CODEC GOLDEN_DQUANT GOLDEN_WUSH \
#       GOLDEN_DQUANT_UNBIASED GOLDEN_WUSH_UNBIASED
set -euo pipefail
synth=$1
cal=$2
codec=$3
golden_dquant=$4
golden_wush=$5
golden_dquant_unbiased=$6
golden_wush_unbiased=$7
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
sum() { sha256sum "$1" | cut -d' ' -f1; }
expect_sum() {  # expect_sum FILE SHA256 WHAT
  [ "$(sum "$1")" = "$2" ] || fail "$3 changed: sha256 $(sum "$1"), expected $2"
}
u32() { od -An -tu4 -j "$2" -N4 "$1" | tr -d ' '; }  # u32 FILE OFFSET
bytes() { tail -c +$(($2 + 1)) "$1" | head -c "$3"; }  # bytes FILE OFFSET COUNT
# same_pool FRESH GOLDEN WHAT: FRESH is version 2 with the resolved payloads
# of the golden version 1 file, and its header fields and layers are the
# golden file's.
same_pool() {
  [ "$(u32 "$1" 8)" = 2 ] || fail "$3: version $(u32 "$1" 8), expected 2"
  [ "$(u32 "$2" 8)" = 1 ] || fail "$3: the golden file is not version 1"
  grep -aq " key_bytes=40 value_bytes=25 " "$1" || fail "$3: the options do not record key_bytes=40 value_bytes=25"
  cmp <(bytes "$1" 12 40) <(bytes "$2" 12 40) >/dev/null || fail "$3: header [12, 52) differs from the golden one"
  cmp <(bytes "$1" 56 72) <(bytes "$2" 56 72) >/dev/null || fail "$3: header [56, 128) differs from the golden one"
  cmp <(tail -c +$(($(u32 "$1" 12) + 1)) "$1") <(tail -c +$(($(u32 "$2" 12) + 1)) "$2") >/dev/null ||
    fail "$3: the layers differ from the golden ones"
}

"$synth" --out "$tmp/s" --layers 2 --tokens 300 --kv-heads 2 --head-dim 64 --query-tokens 16 --seed 7 >/dev/null
"$synth" --out "$tmp/c" --layers 2 --tokens 256 --kv-heads 2 --head-dim 64 --query-tokens 64 --seed 8 >/dev/null
# The inputs first, so that a failure says whether the generator or the codec moved.
expect_sum "$tmp/s.k" c02f694d27ded5136278304a7420649885876babba42cd9110f1f9ecc72f1960 "synthetic keys (seed 7)"
expect_sum "$tmp/s.v" d2d27e1f23d435561ee30a7c982c88ce03ac60a8476f17d4ecdd314a33161276 "synthetic values (seed 7)"
expect_sum "$tmp/c.k" e118a6d7aabd90723886e3bb305a31b791ec20c8cd1f849d884f6fd8e794c3fe "synthetic keys (seed 8)"
"$cal" --keys "$tmp/c.k" --values "$tmp/c.v" --queries "$tmp/c.q" --shape 2,256,2,64 --q-heads 4 \
  --out "$tmp/c.xfm" 2>/dev/null
expect_sum "$tmp/c.xfm" c1d82b27f953656b005349d0540212f021758feedc22a32c8777fd538b1c117a "transforms file"

enc=(encode --keys "$tmp/s.k" --values "$tmp/s.v" --shape 2,300,2,64 --residual 44 --k-bytes 40 --v-bytes 25)
"$codec" "${enc[@]}" --v-refit least_squares --out "$tmp/dquant.dkv" >/dev/null
same_pool "$tmp/dquant.dkv" "$golden_dquant" "the D-Quant pool file"
"$codec" "${enc[@]}" --v-refit least_squares --transform wush --transforms "$tmp/c.xfm" \
  --out "$tmp/wush.dkv" >/dev/null
same_pool "$tmp/wush.dkv" "$golden_wush" "the WUSH pool file"
"$codec" "${enc[@]}" --out "$tmp/dquant_u.dkv" >/dev/null
same_pool "$tmp/dquant_u.dkv" "$golden_dquant_unbiased" "the default D-Quant pool file"
"$codec" "${enc[@]}" --transform wush --transforms "$tmp/c.xfm" --out "$tmp/wush_u.dkv" >/dev/null
same_pool "$tmp/wush_u.dkv" "$golden_wush_unbiased" "the default WUSH pool file"

# Decoding the committed files (not the fresh ones) gives the same floats as before.
"$codec" decode --in "$golden_dquant" --out "$tmp/rd" >/dev/null
expect_sum "$tmp/rd.k" 1f527b4bc19caa0220fa0980a0467013d2a43e3e2d8035e7625e7d9e6a9f4d49 "decoded D-Quant keys"
expect_sum "$tmp/rd.v" f20b67454a6ab37d92418e11237403f14bbc0af2a656aeac5ba3f639944de834 "decoded D-Quant values"
"$codec" decode --in "$golden_wush" --out "$tmp/rw" --transform wush --transforms "$tmp/c.xfm" >/dev/null
expect_sum "$tmp/rw.k" fb6ca70a48ecf3a6e5c5aaeff924b1f3d28f36315beb9400ca1ffa85f97d25c7 "decoded WUSH keys"
expect_sum "$tmp/rw.v" 0f8f41fca63a19618a2dee443434f26145ec2106532475d77c2391f36e77d9f8 "decoded WUSH values"
# The keys of the default files are those above; only the value grids differ.
"$codec" decode --in "$golden_dquant_unbiased" --out "$tmp/ud" >/dev/null
expect_sum "$tmp/ud.k" 1f527b4bc19caa0220fa0980a0467013d2a43e3e2d8035e7625e7d9e6a9f4d49 "decoded default D-Quant keys"
expect_sum "$tmp/ud.v" c57efb32ec460ad37a8b0f3d157c55bc013b4159bded0af53f70213a7b061490 "decoded default D-Quant values"
"$codec" decode --in "$golden_wush_unbiased" --out "$tmp/uw" --transform wush --transforms "$tmp/c.xfm" >/dev/null
expect_sum "$tmp/uw.k" fb6ca70a48ecf3a6e5c5aaeff924b1f3d28f36315beb9400ca1ffa85f97d25c7 "decoded default WUSH keys"
expect_sum "$tmp/uw.v" 6135e910bb2dd5566cf7cd626f0e87a66efadc78610ae70dcc5c77b212fe44af "decoded default WUSH values"
# The fresh version 2 files decode to the same floats as their golden ones.
"$codec" decode --in "$tmp/dquant_u.dkv" --out "$tmp/fd" >/dev/null
cmp "$tmp/fd.k" "$tmp/ud.k" && cmp "$tmp/fd.v" "$tmp/ud.v" || fail "the fresh D-Quant file decodes differently"
"$codec" decode --in "$tmp/wush_u.dkv" --out "$tmp/fw" --transform wush --transforms "$tmp/c.xfm" >/dev/null
cmp "$tmp/fw.k" "$tmp/uw.k" && cmp "$tmp/fw.v" "$tmp/uw.v" || fail "the fresh WUSH file decodes differently"

# Today's default containers for n = 128 (48 and 36 bytes).
"$codec" encode --keys "$tmp/s.k" --values "$tmp/s.v" --shape 2,300,2,64 --residual 44 --out "$tmp/now.dkv" >/dev/null
grep -aq " key_bytes=48 value_bytes=36 " "$tmp/now.dkv" || fail "the default containers of n = 128 are not 48/36"
expect_sum "$tmp/now.dkv" 1814ad6200db2efbd363f9ddb65025c0ee74738d63abd694d5d9762353af7bcf "the D-Quant pool file of today's defaults"
"$codec" decode --in "$tmp/now.dkv" --out "$tmp/nd" >/dev/null
expect_sum "$tmp/nd.k" c2d3f5ad65f502832e15c91fe634b755a47b1c7c47e5466062ca04c8b5cbfa12 "decoded D-Quant keys of today's defaults"
expect_sum "$tmp/nd.v" 69f7b1e237194f984646e730c2c886f14eab13a96ac21c014ac9ac3b066a5089 "decoded D-Quant values of today's defaults"
echo PASS
