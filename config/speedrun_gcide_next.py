# The speedrun recipe (config/speedrun_gcide.py) plus the token-efficiency switches of modded-nanogpt's record
# runs (github.com/KellerJordan/modded-nanogpt, README's record table) that change the model: rotary positions,
# value embeddings and U-net skips. NOT YET MEASURED ON A GPU: each switch is
# to be ablated (docs/speedrun.md) before this replaces the recipe. The values are modded-nanogpt's, not tuned
# here; everything else is speedrun_gcide.py's.
# $ python train.py config/speedrun_gcide_next.py
import os

# beside this file, wherever train.py is run from (the configurator gives config files their __file__)
with open(os.path.join(os.path.dirname(__file__), 'speedrun_gcide.py')) as _f:
    exec(_f.read())

out_dir = 'out-speedrun-next'

# rotary positions (RoFormer, Su et al. 2021) instead of GPT-2's learned table: part of modded-nanogpt's
# "modernized architecture" (with QK-norm and ReLU squared) since its early records, never ablated alone there;
# rope_theta stays 10000, the base modded-nanogpt used until Dec 2024's "improve rotary" record
pos_emb = 'rope'

# value embeddings: 3 more token tables, table i mixed into the attention values of layers i and 9 + i (the
# first 3 and the last 3 of 12), with learned weights starting at 0.5 and 0.5. In modded-nanogpt's records:
# value embeddings (Dec 4 2024) 4.66 -> 4.41 min; shared U-net-wise between first and last layers (Dec 8, with
# other tweaks) 4.41 -> 3.95; only the first 3 and last 3 layers (Dec 17, with other changes) 3.80 -> 3.57
value_embeds = 3

# U-net skips: the output of each of the first 6 blocks, times a learned weight starting at 1, added to the
# input of its mirror block (block j feeds block 11 - j). modded-nanogpt's Nov 10 2024 record, "U-net & 2x lr":
# 8.2 -> 7.2 min (its learning rate doubled in the same record; ours stays speedrun_gcide.py's)
skip_connections = True
