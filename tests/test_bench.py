"""
bench.py's settings that would make an empty or meaningless result: nothing to benchmark is one error line
before any work; a setting that only the benchmark left out uses is a note, and that benchmark's table is not
printed empty.
"""
import json

from conftest import run

TINY = ["--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
        "--vocab_size=64", "--gen_tokens=4", "--warmup_steps=1", "--timed_steps=1", "--check_batch_size=0"]


def test_nothing_to_benchmark_is_one_error_line(tmp_path):
    for lists in (["--batch_sizes=", "--gen_batch_sizes="], ["--batch_sizes=,", "--gen_batch_sizes= , "]):
        r = run("bench.py", *TINY, *lists, f"--out_json={tmp_path / 'bench.json'}", check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            "error: batch_sizes and gen_batch_sizes are both empty, so there is nothing to benchmark: give micro-batch "
            "sizes to time (--batch_sizes=12,32), generation batch sizes (--gen_batch_sizes=1,10), or both"]
        assert "train B=" not in r.stdout and not (tmp_path / "bench.json").exists()


def test_one_benchmark_alone_notes_the_settings_of_the_other_and_prints_no_empty_table(tmp_path):
    out = tmp_path / "bench.json"
    r = run("bench.py", *TINY, "--batch_sizes=", "--gen_batch_sizes=1", "--profile=True", f"--out_json={out}")
    notes = [line for line in r.stdout.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {k}={v} does nothing here: batch_sizes is empty: no training step is timed"
                     for k, v in (("warmup_steps", 1), ("timed_steps", 1), ("profile", True))], r.stdout
    assert "| micro-batch |" not in r.stdout and "| generate batch |" in r.stdout
    result = json.loads(out.read_text())
    assert result["train"] == [] and [g["batch_size"] for g in result["generate"]] == [1]
    # model switches that cannot run here are said, as train.py says them, never silently dropped
    r = run("bench.py", *TINY, "--batch_sizes=2", "--gen_batch_sizes=", f"--out_json={out}", "--bf16_residual=True",
            "--fused_qk=True", "--pos_emb=rope")
    assert [line for line in r.stdout.splitlines() if line.startswith("note:")] == [
        "note: gen_tokens=4 does nothing here: gen_batch_sizes is empty: generation is not timed"]
    assert "fused_qk: off (needs a CUDA GPU (this run: cpu))" in r.stdout
    assert "bf16_residual: off (dtype=float32: the stream takes bfloat16 autocast's dtype)" in r.stdout
    assert "| micro-batch |" in r.stdout and "| generate batch |" not in r.stdout
    assert [t["batch_size"] for t in json.loads(out.read_text())["train"]] == [2]
