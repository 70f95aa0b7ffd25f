"""
SequentialShards: every window read once per epoch across ranks, exact resume from its state.
"""
import os

import numpy as np
import pytest
import torch

from gpt.data.loader import SequentialShards
from gpt.data.sources import write_shard
from gpt.runtime.errors import UserError

B, T, W = 2, 8, 2  # batch_size, block_size, world_size: one step is B*T*W = 32 tokens
LENGTHS = [1000, 1337, 33, 517]  # 33 is exactly one step plus the extra target token


def make_shards(folder, lengths=LENGTHS):
    # token values are global positions (uint32 holds them all), so every token says where it came from
    paths, start = [], 0
    for i, n in enumerate(lengths):
        path = os.path.join(folder, f"synthetic_{'val' if i == 0 else 'train'}_{i:06d}.bin")
        write_shard(path, np.arange(start, start + n), "uint32")
        paths.append(path)
        start += n
    return paths


def loaders(paths, world_size=W):
    return [SequentialShards(paths, B, T, "cpu", rank=r, world_size=world_size) for r in range(world_size)]


def steps_per_epoch(lengths=LENGTHS):
    return sum((n - 1) // (B * T * W) for n in lengths)


def test_two_ranks_read_every_window_once_per_epoch(tmp_path):
    paths = make_shards(tmp_path)
    ranks = loaders(paths)
    starts = set()
    seen = np.zeros(sum(LENGTHS), dtype=int)  # how often each token was an input
    for _ in range(steps_per_epoch()):
        for loader in ranks:
            x, y = loader.next_batch()
            assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
            assert torch.equal(y, x + 1)  # targets are the inputs shifted by one, within one shard
            flat = x.flatten()
            assert torch.equal(flat, torch.arange(flat[0], flat[0] + B * T))  # one contiguous window
            assert int(flat[0]) not in starts  # no window is read twice, by the same rank or another
            starts.add(int(flat[0]))
            seen[flat.numpy()] += 1
            assert loader.epoch == 0
    # every token but each shard's tail (smaller than one step) was read exactly once
    begin = 0
    for n in LENGTHS:
        used = (n - 1) // (B * T * W) * B * T * W
        assert (seen[begin:begin + used] == 1).all() and (seen[begin + used:begin + n] == 0).all()
        begin += n
    # the next batch starts the second epoch from the first shard again
    for r, loader in enumerate(ranks):
        x, _ = loader.next_batch()
        assert loader.epoch == 1 and int(x[0, 0]) == r * B * T


def test_epoch_counter_wraps_repeatedly(tmp_path):
    (loader,) = loaders(make_shards(tmp_path), world_size=1)
    per_epoch = sum((n - 1) // (B * T) for n in LENGTHS)
    first = [loader.next_batch()[0] for _ in range(per_epoch)]
    for epoch in (1, 2):
        again = [loader.next_batch()[0] for _ in range(per_epoch)]
        assert loader.epoch == epoch
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("k", [0, 1, 5, 31, 32, 72, 73, 74, 89, 90, 91])
def test_resume_starts_with_the_pending_batch(tmp_path, k):
    # an epoch is 89 steps (31 in shard 0, 41 in shard 1, 1 in shard 2, 16 in shard 3): k covers the shard
    # boundaries, the one-step shard and the epoch wrap
    assert steps_per_epoch() == 89
    paths = make_shards(tmp_path)
    original = loaders(paths)
    for _ in range(k):
        pending = [loader.next_batch() for loader in original]  # the training loop's prefetched batch
    states = [loader.state_dict() for loader in original]
    assert all(s == states[0] for s in states)  # the same position on every rank: rank 0's checkpoint serves all
    resumed = loaders(paths)
    for loader in resumed:
        loader.load_state_dict(states[0])
        assert loader.state_dict() == states[0]
    want = ([pending] if k else []) + [[loader.next_batch() for loader in original] for _ in range(60)]
    got = [[loader.next_batch() for loader in resumed] for _ in range(len(want))]
    for w, g in zip(want, got):
        for (wx, wy), (gx, gy) in zip(w, g):
            assert torch.equal(wx, gx) and torch.equal(wy, gy)
    assert [loader.epoch for loader in resumed] == [loader.epoch for loader in original]


def position(loader):
    return {k: loader.state_dict()[k] for k in ("shard", "offset", "epoch")}


def test_state_before_first_batch(tmp_path):
    paths = make_shards(tmp_path)
    (loader,) = loaders(paths, world_size=1)
    assert position(loader) == {"shard": 0, "offset": 0, "epoch": 0}
    loader.next_batch()
    assert position(loader) == {"shard": 0, "offset": 0, "epoch": 0}
    loader.next_batch()
    assert position(loader) == {"shard": 0, "offset": B * T, "epoch": 0}
    # the state also names the shards it counts in, so a resume on other files is caught
    assert loader.state_dict()["shards"] == [[os.path.basename(p), n] for p, n in zip(paths, LENGTHS)]


def test_loader_errors(tmp_path):
    with pytest.raises(UserError, match="no token shards"):
        SequentialShards([], B, T, "cpu")
    paths = make_shards(tmp_path, [100, 32])
    with pytest.raises(UserError, match=r"_000001.bin has 32 tokens, too few for one batch.* 33"):
        loaders(paths)
    (loader,) = loaders(paths[:1], world_size=1)
    with pytest.raises(UserError, match="shard 3, but there are only 1 shards"):
        loader.load_state_dict({"shard": 3, "offset": 0, "epoch": 0})


def test_uint16_shards(tmp_path):
    path = str(tmp_path / "u_train_000001.bin")
    write_shard(path, np.arange(1000) % 65536)
    loader = SequentialShards([path], B, T, "cpu")
    x, y = loader.next_batch()
    assert x.dtype == torch.int64 and x.flatten().tolist() == list(range(B * T))


def windows(path, world_size, rank, n, micro_steps=1, batch=B, seed=3):
    from gpt.data.loader import RandomWindows
    loader = RandomWindows(str(path), batch, T, "cpu", "uint32", seed, rank, 0, None, world_size, micro_steps)
    return [loader.next_batch()[0] for _ in range(n)]


def test_random_windows_are_the_same_global_batch_however_it_is_split(tmp_path):
    # one process with 2 micro-steps, two ranks with 1 each, four ranks with 1 of half the size: each step
    # trains on the same windows (gpt/training/schedule.py's split_batch picks such splits for 1, 2, 4 GPUs)
    path = tmp_path / "train.bin"
    np.arange(5000, dtype=np.uint32).tofile(path)
    steps = 3
    one = windows(path, 1, 0, 2 * steps, micro_steps=2)
    two = [windows(path, 2, r, steps) for r in (0, 1)]
    four = [windows(path, 4, r, steps, batch=B // 2) for r in range(4)]
    for k in range(steps):
        step = torch.cat([one[2 * k], one[2 * k + 1]])
        assert torch.equal(torch.cat([two[0][k], two[1][k]]), step)
        assert torch.equal(torch.cat([four[r][k] for r in range(4)]), step)
    assert not torch.equal(one[0], one[1]) and not torch.equal(one[0], one[2])  # and no window is read twice


def test_random_windows_resume_on_another_split(tmp_path):
    from gpt.data.loader import RandomWindows
    path = tmp_path / "train.bin"
    np.arange(5000, dtype=np.uint32).tofile(path)
    one = windows(path, 1, 0, 8, micro_steps=2)
    saved = RandomWindows(str(path), B, T, "cpu", "uint32", 3, 0, 0, None, 1, 2)
    for _ in range(5):  # 2 steps of 2 micro-batches used, the 5th fetched and not yet used (as train.py holds one)
        saved.next_batch()
    state = saved.state_dict()
    assert state == {"batches": 4, "world_size": 1, "micro_steps": 2, "file": "train.bin", "tokens": 5000}
    resumed = [RandomWindows(str(path), B, T, "cpu", "uint32", 3, r, 0, None, 2) for r in (0, 1)]
    for r in resumed:
        r.load_state_dict(state)
    # two ranks of one micro-step go on at step 2: micro-batches 4 and 5, then 6 and 7
    for n in range(2):
        assert torch.equal(resumed[0].next_batch()[0], one[4 + 2 * n])
        assert torch.equal(resumed[1].next_batch()[0], one[5 + 2 * n])




def test_a_resume_on_other_files_is_one_line_naming_both(tmp_path):
    from gpt.data.loader import RandomWindows
    np.arange(5000, dtype=np.uint32).tofile(tmp_path / "train.bin")
    windows = RandomWindows(str(tmp_path / "train.bin"), B, T, "cpu", "uint32")
    windows.next_batch()
    os.makedirs(tmp_path / "bins")
    bins = make_shards(tmp_path / "bins", [100, 500])
    (shards,) = loaders(bins, world_size=1)
    shards.next_batch()
    os.makedirs(tmp_path / "npy")
    np.save(tmp_path / "npy" / "x_train_000001.npy", np.arange(600, dtype=np.uint16))
    (npy,) = loaders([str(tmp_path / "npy" / "x_train_000001.npy")], world_size=1)
    changed = "the dataset's files changed since the checkpoint"
    with pytest.raises(UserError, match=changed) as e:  # train.bin's state, resumed on shards
        shards.load_state_dict(windows.state_dict())
    assert "train.bin (5,000 tokens)" in str(e.value) and "2 shards (synthetic_val_000000.bin to" in str(e.value)
    with pytest.raises(UserError, match=changed) as e:  # and the other way round
        windows.load_state_dict(shards.state_dict())
    assert str(e.value).index("2 shards") < str(e.value).index("train.bin (5,000 tokens)")
    with pytest.raises(UserError, match=changed) as e:  # .bin shards' state, resumed on .npy shards
        npy.load_state_dict(shards.state_dict())
    assert "shard x_train_000001.npy (600 tokens)" in str(e.value)
    (again,) = loaders(bins[1:], world_size=1)  # a shard less
    with pytest.raises(UserError, match=changed):
        again.load_state_dict(shards.state_dict())
    state = shards.state_dict()
    del state["shards"]  # an older checkpoint's: the position alone, checked as before
    again.load_state_dict(state)


def test_the_data_is_the_one_checked_at_start(tmp_path):
    from gpt.data.loader import RandomWindows
    path = tmp_path / "train.bin"
    np.arange(5000, dtype=np.uint32).tofile(path)
    loader = RandomWindows(str(path), B, T, "cpu", "uint32", 3)
    same = RandomWindows(str(path), B, T, "cpu", "uint32", 3)
    np.zeros(5000, dtype=np.uint32).tofile(tmp_path / "new.bin")
    os.replace(tmp_path / "new.bin", path)  # replaced by rename, as prepare scripts write: not seen
    assert torch.equal(loader.next_batch()[0], same.next_batch()[0]) and same.next_batch()[0].any()
    truncated = RandomWindows(str(path), B, T, "cpu", "uint32", 3)
    os.truncate(path, 1000)  # changed in place: one line, not a crash reading past the file's new end
    with pytest.raises(UserError, match=r"train.bin was changed in place while the run read it \(20,000 bytes"):
        truncated.next_batch()
    paths = make_shards(tmp_path, [100, 500])
    (shards,) = loaders(paths, world_size=1)
    write_shard(paths[1], np.arange(400), "uint32")  # the next shard, replaced before the run reaches it
    with pytest.raises(UserError, match="_000001.bin changed since the run started"):
        for _ in range(10):
            shards.next_batch()


def test_token_files_of_the_other_width_are_refused(tmp_path):
    from gpt.data.loader import check_split
    np.arange(1000, dtype=np.uint32).tofile(tmp_path / "train.bin")  # ids < 65536: each followed by a 0 as uint16
    with pytest.raises(UserError, match="looks like uint32 tokens read as uint16"):
        check_split(str(tmp_path), "train", T, 1000, "uint16", "prepare")
    check_split(str(tmp_path), "train", T, 1000, "uint32", "prepare")
    (np.arange(1000, dtype=np.uint16) + 1).tofile(tmp_path / "train.bin")
    with pytest.raises(UserError, match="looks like uint16 tokens read as uint32"):
        check_split(str(tmp_path), "train", T, 1001, "uint32", "prepare")
    check_split(str(tmp_path), "train", T, 1001, "uint16", "prepare")


def test_a_damaged_data_position_is_one_line(tmp_path):
    from gpt.data.loader import RandomWindows
    np.arange(5000, dtype=np.uint32).tofile(tmp_path / "train.bin")
    windows = RandomWindows(str(tmp_path / "train.bin"), B, T, "cpu", "uint32")
    (shards,) = loaders(make_shards(tmp_path, [100, 500]), world_size=1)
    for loader, state in [(windows, {"batches": "4"}), (windows, {"batches": 4, "micro_steps": 0}), (windows, [4]),
                          (shards, {"shard": 0, "offset": -16, "epoch": 0}), (shards, {"shard": 0}),
                          (shards, {"shard": 0, "offset": 0, "epoch": 0, "shards": [3]})]:
        with pytest.raises(UserError, match="data position .* is not one the loaders write"):
            loader.load_state_dict(state)


@pytest.mark.parametrize("kind", ["shards", "windows"])
def test_skip_passes_over_exactly_the_batch_next_batch_reads(tmp_path, kind):
    """An evaluation under N processes reads one process's batches on every rank and skips the others' (gpt/
    training/evaluation.py): skip() must land where next_batch() would, across shard ends and epochs too."""
    from gpt.data.loader import RandomWindows
    if kind == "shards":
        paths = make_shards(tmp_path)
        make = lambda: SequentialShards(paths, B, T, "cpu")
    else:
        path = tmp_path / "val.bin"
        np.arange(5000, dtype=np.uint32).tofile(path)
        make = lambda: RandomWindows(str(path), B, T, "cpu", "uint32", 3, stream=1)
    n = 2 * sum((length - 1) // (B * T) for length in LENGTHS) + 3  # past two epochs of the shards
    read = make()
    every = [read.next_batch()[0] for _ in range(n)]
    for world in (2, 3):
        for rank in range(world):
            loader = make()
            mine = [loader.next_batch()[0] if k % world == rank else loader.skip() for k in range(n)]
            for k in range(rank, n, world):
                assert torch.equal(mine[k], every[k]), (world, rank, k)
