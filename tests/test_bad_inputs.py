"""
Scripts check their inputs and their outputs' places before the work: each mistake is one `error:` line and
exit status 2, found before any benchmark, conversion or process group starts.
"""
import pytest
from conftest import run

from gpt.runtime import distributed
from gpt.runtime.errors import UserError


def one_error_line(r):
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return r.stderr.strip().splitlines()[-1]


def test_bench_checks_out_json_before_benchmarking(tmp_path):
    # a full-size model would take minutes on a CPU before failing to write: the line comes first
    r = run("bench.py", "--device=cpu", f"--out_json={tmp_path / 'missing' / 'bench.json'}", check=False)
    line = one_error_line(r)
    assert line.startswith("error: --out_json=") and "missing does not exist" in line, line
    assert "train B=" not in r.stdout


def test_bench_refuses_an_unknown_optimizer_before_benchmarking():
    line = one_error_line(run("bench.py", "--device=cpu", "--optimizer=sgd", check=False))
    assert line.startswith("error: unknown optimizer 'sgd'") and "'muon'" in line, line


def test_convert_checkpoint_without_a_sharded_checkpoint(tmp_path):
    (tmp_path / "ckpt_dcp").mkdir()
    line = one_error_line(run("convert_checkpoint.py", f"--out_dir={tmp_path}", check=False))
    assert "ckpt_dcp is not a whole sharded checkpoint" in line and "train_state.pt" in line, line


@pytest.mark.parametrize("backend,device,words", [
    ("bogus", "cpu", "backend='bogus': that is not a backend this torch can start"),
    ("cpu:bogus", "cpu", "'bogus' for device 'cpu' is not a backend"),
    ("bogus:gloo", "cpu", "'gloo' for device 'bogus' is not a backend"),
    ("cuda:gloo", "cpu", "has nothing for this run's device (cpu)"),
])
def test_a_backend_torch_cannot_start_is_one_line_before_joining(monkeypatch, backend, device, words):
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: pytest.fail("joined"))
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="localhost",
                           MASTER_PORT="29500").items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UserError) as e:
        distributed.init_process(device, backend, 1)
    assert words in str(e.value) and "backend='' picks" in str(e.value)


def test_backends_torch_can_start_pass():
    for backend in ("", "gloo", "GLOO", "cpu:gloo", "cpu:gloo,cuda:gloo"):
        distributed.check_backend(backend, "cpu")
