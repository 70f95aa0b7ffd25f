#!/usr/bin/env bash
# The speedrun recipe (config/speedrun_gcide.py) at one seed on two checkouts, back to back on one GPU machine,
# each run scored over the whole of val.bin: a refactor's "same results" check.
#   $ bash dev/speedrun_before_after.sh OLD_CHECKOUT ANCHOR GCIDE_NANOGPT_CONFIG [SEED]     (logs under $OUT)
# Both checkouts need data/gcide/{train,val}.bin (../shared/bench/make_corpus.py builds them). nanoGPT is not
# run: the target is its score from docs/speedrun.md, which only sets the table's percentages.
set -euo pipefail
old=$(cd "$1" && pwd); new=$(pwd); anchor=$(cd "$2" && pwd); nanocfg=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
seed=${4:-1337}; out=${OUT:-speedrun-before-after}; mkdir -p "$out"; out=$(cd "$out" && pwd)
python3 -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name())' | tee "$out/machine.txt"
for side in old new; do
    dir=$old; script=scripts/speedrun.py
    [ "$side" = new ] && dir=$new
    [ -f "$dir/dev/speedrun.py" ] && script=dev/speedrun.py
    (cd "$dir" && python3 "$script" --anchor="$anchor" --nanogpt_config="$nanocfg" --reference=102.8,2.5275 \
        --seeds="$seed" --curve=0 --out="/tmp/speedrun-$side") > "$out/speedrun-$side.log" 2>&1
    cp "/tmp/speedrun-$side/speedrun.md" "$out/speedrun-$side.md"
    grep "| this project |" "$out/speedrun-$side.md" | sed "s/^/$side: /"
done
