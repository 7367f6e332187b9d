#!/usr/bin/env bash
# Reproduces the WUSH-KV figures of docs/quality.md.
#   bench/wush_eval.sh BIN_DIR WORK_DIR
# BIN_DIR holds driftkv-calibrate, driftkv-codec and wush-ablation (e.g.
# bazel-bin/tools); WORK_DIR receives the captured tensors (~350 MB), the
# transforms file and the results. Needs /usr/bin/python3 with torch (Debian
# python3-torch) and Debian's r-cran-janeaustenr for the text.
set -euo pipefail
bin=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
fixture=$here/../../shared/eval/fixture_public
mkdir -p "$work"
cd "$work"

# 1. Calibration and evaluation tensors from disjoint parts of Persuasion.
[ -f data/ranges.json ] || /usr/bin/python3 "$here/wush_capture.py" --out data

# 2. Calibration: 16 windows (16,384 tokens per layer) in two triples, W_O.
/usr/bin/time -f "calibration wall %e s, user %U s" "$bin/driftkv-calibrate" \
  --keys data/calib0.k.f16 --values data/calib0.v.f16 --queries data/calib0.q.f16 \
  --keys data/calib1.k.f16 --values data/calib1.v.f16 --queries data/calib1.q.f16 \
  --shape 4,8192,4,128 --q-heads 8 --dtype f16 --wo data/wo.f32 --hidden 512 --out wush.xfm
# The D-Quant variant: key Gram over 128-token-window-mean-free keys.
"$bin/driftkv-calibrate" \
  --keys data/calib0.k.f16 --values data/calib0.v.f16 --queries data/calib0.q.f16 \
  --keys data/calib1.k.f16 --values data/calib1.v.f16 --queries data/calib1.q.f16 \
  --shape 4,8192,4,128 --q-heads 8 --dtype f16 --wo data/wo.f32 --hidden 512 --center-keys 128 \
  --out wush_c128.xfm

# 3. driftkv-codec eval (attn_rel_err) on the fixture (2 windows) and on all
#    8 evaluation windows, every codec point and transform.
points=("int --bits 2" "int --bits 4" "dquant"
        "dquant --k-bytes 140 --v-bytes 96 --k-levels 6 --v-levels 5")
for p in "${points[@]}"; do
  for t in identity hadamard wush; do
    extra=()
    [ "$t" = wush ] && extra=(--transforms wush.xfm)
    # shellcheck disable=SC2086
    f=$("$bin/driftkv-codec" eval --keys "$fixture.k.bin" --values "$fixture.v.bin" \
      --queries "$fixture.q.bin" --q-heads 8 --shape 8,1024,4,128 --dtype f16 \
      --codec $p --transform "$t" "${extra[@]}" --json)
    # shellcheck disable=SC2086
    a=$("$bin/driftkv-codec" eval --keys data/eval.k.f16 --values data/eval.v.f16 \
      --queries data/eval.q.f16 --q-heads 8 --shape 32,1024,4,128 --dtype f16 \
      --codec $p --transform "$t" "${extra[@]}" --json)
    echo "$p | $t | fixture $f | all8 $a"
  done
done | tee eval_cli.txt

# 4. The ablation (keys only / values only / both, module error with W_O).
"$bin/wush-ablation" --keys data/eval.k.f16 --values data/eval.v.f16 --queries data/eval.q.f16 \
  --windows 8 --shape 4,1024,4,128 --q-heads 8 --dtype f16 --transforms wush.xfm \
  --wo data/wo.f32 --hidden 512 --threads 2 | tee ablation.md
"$bin/wush-ablation" --keys data/eval.k.f16 --values data/eval.v.f16 --queries data/eval.q.f16 \
  --windows 8 --shape 4,1024,4,128 --q-heads 8 --dtype f16 --transforms wush_c128.xfm \
  --wo data/wo.f32 --hidden 512 --threads 2 | tee ablation_c128.md

# 5. The synthetic spike case.
"$bin/wush-ablation" --synthetic-spike --draws 4 | tee spike.md
"$bin/wush-ablation" --synthetic-spike --draws 4 --center-keys 128 | tee spike_c128.md

# 6. Model KL (bench/kl_eval.py's 24 windows, disjoint from calibration).
/usr/bin/python3 "$here/wush_kl.py" --codec-bin "$bin/driftkv-codec" --transforms wush.xfm --out kl
/usr/bin/python3 "$here/wush_kl.py" --codec-bin "$bin/driftkv-codec" --transforms wush_c128.xfm \
  --codecs dquant --kinds wush --out kl_c128
# Centred WUSH vs Hadamard for dquant, paired over the 24 windows.
(cd "$here" && /usr/bin/python3 - "$work" <<'PY'
import json, random, sys
from kl_eval import geo_ratio
a = json.load(open(sys.argv[1] + "/kl/wush_kl.json"))
c = json.load(open(sys.argv[1] + "/kl_c128/wush_kl.json"))
rng = random.Random(0)
for lab in ("dquant default", "dquant 1.96 point"):
    g, lo, hi, wins = geo_ratio(c[lab + "|wush"]["kl"], a[lab + "|hadamard"]["kl"], 20000, rng)
    print(f"{lab}: centred WUSH / Hadamard KL {g:.3f} [{lo:.3f}, {hi:.3f}], lower in {wins}/24")
PY
)
