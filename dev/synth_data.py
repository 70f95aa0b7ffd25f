"""
Synthetic GPT-2-token shards in data/synth (random ids: 80M train, 4M val), for the scaling benchmarks
(dev/bench_scaling.sh, dev/bench_ddp.sh), which measure speed, not learning.
$ python dev/synth_data.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from gpt.data.sources import write_shard  # noqa: E402

os.makedirs('data/synth', exist_ok=True)
rng = np.random.default_rng(0)
write_shard('data/synth/synth_val_000000.bin', rng.integers(0, 50257, 4_000_000))
for i in (1, 2):
    write_shard(f'data/synth/synth_train_00000{i}.bin', rng.integers(0, 50257, 40_000_000))
with open('data/synth/meta.json', 'w') as f:
    json.dump({"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16", "format": "shards"}, f)
