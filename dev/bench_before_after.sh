#!/usr/bin/env bash
# The same GPU measurements on two checkouts, back to back on one machine: bench.py (GPT-2 124M training
# step and generation) and config/train_shakespeare_char.py (time from launch to val loss <= 1.47, best val).
# For "no change in behaviour or speed" checks of a refactor.
#   $ bash dev/bench_before_after.sh OLD_CHECKOUT [NEW_CHECKOUT]      (logs under $OUT, or ./bench-out)
# Each checkout needs data/shakespeare_char/{train,val}.bin and meta.json (python data/shakespeare_char/prepare.py).
# The shakespeare runs alternate old, new, new, old, so a drift of the machine shows up as such.
set -euo pipefail
old=$(cd "$1" && pwd); new=$(cd "${2:-.}" && pwd)
out=${OUT:-bench-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
python3 -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name())' | tee "$out/machine.txt"

bench() {  # $1 label, $2 checkout
    (cd "$2" && python3 bench.py --out_json="$out/bench-$1.json") 2>&1 | tee "$out/bench-$1.log" | tail -12
}
shakespeare() {  # $1 label, $2 checkout, $3 run number
    (cd "$2" && python3 train.py config/train_shakespeare_char.py --out_dir="$out/tmp-$1-$3") 2>&1 \
        > "$out/shakespeare-$1-$3.log"
    rm -rf "$out/tmp-$1-$3"
    # the first evaluation at or below 1.47, and the best val loss
    python3 - "$out/shakespeare-$1-$3.log" "$1" <<'EOF'
import re, sys
evals = [(int(s), float(v), float(t)) for s, v, t in
         re.findall(r"step (\d+): .*val loss ([\d.]+).*?, ([\d.]+)s since launch", open(sys.argv[1]).read())]
hit = next(((s, v, t) for s, v, t in evals if v <= 1.47), None)
best = min(v for _, v, _ in evals)
print(f"{sys.argv[2]:4s} shakespeare_char: val <= 1.47 at " + (f"step {hit[0]} ({hit[1]:.4f}), {hit[2]:.1f} s"
      if hit else "never") + f"; best val {best:.4f}; last evaluation at {evals[-1][2]:.1f} s")
EOF
}
bench old "$old"
bench new "$new"
for i in 1 2; do
    if [ $i = 1 ]; then order="old new"; else order="new old"; fi
    for label in $order; do
        dir=$old; [ $label = new ] && dir=$new
        shakespeare $label "$dir" $i | tee -a "$out/summary.txt"
    done
done
