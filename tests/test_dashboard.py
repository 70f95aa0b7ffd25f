"""
The live dashboard: the server's incremental /log answers, only to requests addressed to it (not to a name
pointed at it: DNS rebinding), its port taken before it serves, a training process's server that lets an open
page read the run's end before it goes, `python dashboard.py` on a run folder, and the page in a real browser
(headless Chromium through playwright) during a CPU training run with dashboard=True: its charts show the
run's points and grow as training goes on, and it shows the run's end. The screenshot is kept as a test
artifact in $TEST_ARTIFACTS where that is set (CI), else only in the test's tmp_path: never in the checkout.
"""
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import ROOT, flags, tiny, write_char_dataset

from gpt.monitor import server as dashboard
from gpt.monitor.trainlog import read_log
from gpt.runtime.errors import UserError

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = os.environ.get("TEST_ARTIFACTS")
# goes on until the test stops it (SIGTERM: checkpoint and exit), however fast or slow this machine is
TRAIN = tiny(batch_size=8, eval_interval=20, log_interval=5, warmup_iters=10, lr_decay_iters=1000, max_iters=100000,
             sample_interval=20, num_samples_train=2, sample_max_tokens=24, sample_prompt="ROMEO:")


def start(args, marker):
    """Popen a script with its output read by a thread; returns (process, the first line holding marker,
    a list that keeps every line)."""
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines, found = [], queue.Queue()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                found.put(line)
        found.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        line = found.get(timeout=120)
    except queue.Empty:
        line = None
    if line is None:
        proc.kill()
        pytest.fail(f"no '{marker}' line from {args[0]}:\n" + "".join(lines)[-3000:])
    return proc, line, lines


def url_in(line):
    return line[line.index("http://"):].split()[0]


def serve(out_dir, port, training=False):
    """A dashboard for out_dir, serving (as train.py starts its own)."""
    return dashboard.start(dashboard.make_server(out_dir, port, training=training))


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


@pytest.fixture(scope="module")
def char_data(corpus_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("dashboard_data")
    write_char_dataset(d, corpus_path)
    return d


def test_log_is_served_in_complete_rows_from_an_offset(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    rows = [{"kind": "train", "step": i, "tokens": 10 * i, "loss": 1.0} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "tra')  # a row being written
    first = dashboard.read_rows(path, 0)
    assert first["rows"] == rows and not first["reset"] and not first["more"]
    assert dashboard.read_rows(path, first["offset"])["rows"] == []
    with open(path, "a") as f:
        f.write('in", "step": 3}\n')
    assert dashboard.read_rows(path, first["offset"])["rows"] == [{"kind": "train", "step": 3}]
    # a resumed run cut the log back: everything again, from the start
    path.write_text(json.dumps(rows[0]) + "\n")
    again = dashboard.read_rows(path, first["offset"])
    assert again["reset"] and again["rows"] == rows[:1]
    # a long log comes in chunks of whole rows
    monkeypatch.setattr(dashboard, "MAX_CHUNK", 100)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows * 5))
    offset, got = 0, []
    while True:
        answer = dashboard.read_rows(path, offset)
        got += answer["rows"]
        offset = answer["offset"]
        if not answer["more"]:
            break
    assert got == rows * 5
    assert dashboard.read_rows(tmp_path / "missing.jsonl", 0) == {"offset": 0, "rows": [], "more": False,
                                                                  "reset": False}


def test_dashboard_script_serves_a_finished_run(tmp_path):
    rows = [{"kind": "train", "step": 0, "tokens": 64, "loss": 4.1}, {"kind": "eval", "step": 0, "val_loss": 4.2}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc, line, lines = start(["dashboard.py", f"--out_dir={tmp_path}", "--port=0"], "http://127.0.0.1:")
    try:
        url = url_in(line)
        answer = json.loads(get(url + "log?offset=0"))
        assert answer["rows"] == rows and answer["run"] == tmp_path.name
        assert b"uPlot.iife.min.js" in get(url) and b"uPlot" in get(url + "uPlot.iife.min.js")
        with pytest.raises(urllib.error.HTTPError):
            get(url + "../dashboard.py")
        # a second server on the same port is a one-line error
        with pytest.raises(UserError, match="cannot listen on 127.0.0.1"):
            serve(tmp_path, int(url.rsplit(":", 1)[1].strip("/")))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def ask(server, host, path="/log?offset=0"):
    """The status of a GET with this Host header (None: no Host header at all)."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.putrequest("GET", path, skip_host=True)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    status = conn.getresponse().status
    conn.close()
    return status


def test_only_requests_addressed_to_this_server_are_answered(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"kind": "train", "step": 0}\n')
    server = serve(tmp_path, 0)
    port = server.server_address[1]
    try:
        # its own names and addresses, on any port (an ssh tunnel from another local port)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST:9000", "localhost"):
            assert ask(server, host) == 200, host
            assert ask(server, host, "/") == 200, host
        # another name pointed at 127.0.0.1 (DNS rebinding), or none: refused, the page and the log alike
        for host in (f"attacker.example:{port}", f"localhost.attacker.example:{port}", "", None):
            assert ask(server, host) == 403, host
            assert ask(server, host, "/") == 403, host
    finally:
        server.finish(0)
    # bound to every address (--host=0.0.0.0): this machine's name and its addresses too, still no other name
    everywhere = dashboard.make_server(tmp_path, 0, "0.0.0.0")
    try:
        assert everywhere.serves(f"{socket.gethostname()}:8000") and everywhere.serves("192.168.1.20:8000")
        assert not everywhere.serves("attacker.example:8000")
    finally:
        everywhere.server_close()


def test_the_port_is_taken_before_the_server_serves(tmp_path):
    server = dashboard.make_server(tmp_path, 0, training=True)  # train.py: before out_dir is claimed
    try:
        with pytest.raises(UserError, match="cannot listen on 127.0.0.1"):
            dashboard.make_server(tmp_path, server.server_address[1])
        dashboard.start(server)  # once the run starts
        assert json.loads(get(dashboard.url(server) + "log"))["rows"] == []
    finally:
        server.finish(0)


def poll(server, page, offset):
    return json.loads(get(f"{dashboard.url(server)}log?offset={offset}&page={page}"))["offset"]


def test_the_end_waits_for_an_open_page_to_read_the_last_rows(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    log.write_text('{"kind": "train", "step": 0}\n')
    idle = serve(tmp_path, 0, training=True)
    t0 = time.monotonic()
    idle.finish(timeout=5)  # no page open: the run ends at once
    assert time.monotonic() - t0 < 0.5
    server = serve(tmp_path, 0, training=True)
    offset = poll(server, "a", 0)  # a page is open and has read everything so far
    with open(log, "a") as f:  # the run's last evaluation and its end
        f.write('{"kind": "eval", "step": 1}\n{"kind": "end", "step": 1}\n')
    read = []
    threading.Timer(0.5, lambda: read.append(poll(server, "a", offset))).start()  # its next poll
    t0 = time.monotonic()
    server.finish(timeout=5)
    assert read == [log.stat().st_size] and time.monotonic() - t0 < 2  # it waited for that poll, no longer
    with pytest.raises(urllib.error.URLError):
        get(dashboard.url(server))  # and then stopped serving
    # a page that stops asking (closed) is waited for only until it would have asked again; never past timeout
    monkeypatch.setattr(dashboard, "POLLING_S", 0.3)
    for timeout in (5, 0.2):
        server = serve(tmp_path, 0, training=True)
        poll(server, "closed", 0)
        with open(log, "a") as f:
            f.write('{"kind": "end", "step": 2}\n')
        t0 = time.monotonic()
        server.finish(timeout=timeout)
        assert time.monotonic() - t0 < min(timeout, 0.3) + 0.2


def browser_or_skip():
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    return pytest.importorskip("playwright.sync_api", reason="pip install playwright").sync_playwright


def launch(p):
    return p.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync"])


def test_page_charts_mfu_and_hellaswag_when_the_log_has_them(tmp_path):
    sync_playwright = browser_or_skip()
    from test_plot import write_log
    write_log(tmp_path, hellaswag=True)  # a GPU run's log: MFU from step 50, HellaSwag at every evaluation
    server = serve(tmp_path, 0)
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page()
            page.goto(dashboard.url(server))
            page.wait_for_function("document.getElementById('hellaswag')", timeout=30000)
            points = page.evaluate("Object.fromEntries([...document.querySelectorAll('.card[data-points]')]"
                                   ".map(c => [c.id, +c.dataset.points]))")
            # 21 train rows (MFU from 16 of them), 5 evaluations
            assert points == {"loss-step": 21 + 2 * 5, "loss-tokens": 21 + 2 * 5, "lr": 21, "grad-norm": 21,
                              "tokens-per-s": 21, "mfu": 16, "hellaswag": 2 * 5}
            assert page.evaluate("dashboard.plots.mfu.data[1].filter(v => v != null)[0]") == pytest.approx(31)
            browser.close()
    finally:
        server.shutdown()


def test_finished_run_fits_a_narrow_window_and_says_so(tmp_path):
    sync_playwright = browser_or_skip()
    from test_plot import write_log
    write_log(tmp_path)
    with open(tmp_path / "log.jsonl", "a") as f:  # the last step is an evaluation, no train row (log_interval)
        f.write(json.dumps({"kind": "eval", "step": 201, "tokens": 201 * 512, "time": 20.1, "val_loss": 1.5}) + "\n")
        f.write(json.dumps({"kind": "end", "step": 201, "tokens": 201 * 512, "time": 20.1, "stopped": False}) + "\n")
    (tmp_path / "quiet").mkdir()
    write_log(tmp_path / "quiet")  # no end row, and quiet for an hour: crashed or killed
    with open(tmp_path / "quiet" / "log.jsonl", "a") as f:
        f.write(json.dumps({"kind": "eval", "step": 205, "tokens": 205 * 512, "time": 20.5, "val_loss": 1.5}) + "\n")
    os.utime(tmp_path / "quiet" / "log.jsonl", (0, os.path.getmtime(tmp_path / "quiet" / "log.jsonl") - 3600))
    servers = [serve(tmp_path, 0), serve(tmp_path / "quiet", 0)]
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 420, "height": 900})
            failed = []
            page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
            page.goto(dashboard.url(servers[0]))
            page.wait_for_function("document.body.dataset.status === 'ended'", timeout=30000)
            assert page.inner_text("#status") == "finished: 201 steps, 103k tokens"
            assert page.title().endswith(": step 201")  # the run's last step, not its last train row's (200)
            # every chart inside the 420 px window, nothing to scroll sideways
            assert page.evaluate("document.documentElement.scrollWidth") <= 420
            rights = page.evaluate("[...document.querySelectorAll('.card canvas, .card .u-legend')]"
                                   ".map(e => e.getBoundingClientRect().right)")
            assert len(rights) >= 10 and max(rights) <= 420, rights
            page.goto(dashboard.url(servers[1]))
            page.wait_for_function("document.body.dataset.status === 'stale'", timeout=30000)
            assert page.inner_text("#status").startswith("no new log rows for 60 min")
            assert page.title().endswith(": step 205")  # its last evaluation, after its last train row
            assert failed == []  # the favicon too
            browser.close()
        assert get(dashboard.url(servers[0]) + "favicon.ico") == b""
        assert json.loads(get(dashboard.url(servers[1]) + "log"))["idle_s"] > 3500
        # the training process's own server is live while it answers, however quiet its log
        servers.append(serve(tmp_path / "quiet", 0, training=True))
        assert json.loads(get(dashboard.url(servers[2]) + "log"))["idle_s"] is None
    finally:
        for server in servers:
            server.shutdown()


def test_live_page_in_headless_chromium(char_data, tmp_path):
    sync_playwright = browser_or_skip()
    out_dir = tmp_path / "out"
    args = ["train.py", f"--data_dir={char_data}", "--dataset=chars", f"--out_dir={out_dir}", "--dashboard=True",
            "--dashboard_port=0", *flags(**TRAIN)]
    proc, line, lines = start(args, "dashboard: http://127.0.0.1:")
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url_in(line))
            count = lambda: page.evaluate(
                "[+document.body.dataset.trainRows || 0, +document.body.dataset.evalRows || 0]")
            page.wait_for_function("+document.body.dataset.trainRows > 0", timeout=60000)
            first_train, _ = count()
            # live: more rows arrive without reloading, evaluations and samples among them
            page.wait_for_function(f"+document.body.dataset.trainRows >= {first_train + 3} && "
                                   f"+document.body.dataset.evalRows >= 2 && document.body.dataset.samplesStep !== ''",
                                   timeout=90000)
            shown = page.evaluate("dashboard.rows.train.map(r => r.step)")
            log = read_log(out_dir)
            assert shown == [r["step"] for r in log if r["kind"] == "train"][:len(shown)]
            # every chart of a CPU run, and the points it plotted (read at one moment: the page goes on)
            charts, train_rows, eval_rows = page.evaluate("""[Object.fromEntries(Object.entries(dashboard.plots)
                .map(([id, u]) => [id, {x: u.data[0].length, points: +document.getElementById(id).dataset.points,
                                        canvas: !!document.querySelector('#' + id + ' canvas')}])),
                dashboard.rows.train.length, dashboard.rows.eval.length]""")
            # no MFU on a CPU
            assert set(charts) == {"loss-step", "loss-tokens", "lr", "grad-norm", "tokens-per-s"}, charts
            assert all(c["canvas"] and c["points"] > 0 for c in charts.values()), charts
            # loss vs step: a loss per train row, and a train and a val loss per evaluation
            assert charts["loss-step"]["points"] == train_rows + 2 * eval_rows
            assert charts["lr"]["points"] == charts["lr"]["x"] == train_rows
            assert charts["grad-norm"]["points"] == train_rows  # every step's norm is finite here
            samples = page.inner_text("#samples")
            assert "ROMEO:" in samples
            page.wait_for_function(f"+document.body.dataset.trainRows > {train_rows}", timeout=60000)  # still live
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            if ARTIFACTS:
                os.makedirs(ARTIFACTS, exist_ok=True)
                shutil.copy(shot, os.path.join(ARTIFACTS, "dashboard.png"))
            assert shot.stat().st_size > 10000
            proc.send_signal(signal.SIGTERM)  # finish the step, checkpoint, exit
            proc.wait(timeout=60)
            # the run waited for the open page to read its end before its server went
            page.wait_for_function("document.body.dataset.status === 'ended'", timeout=10000)
            assert page.inner_text("#status").startswith("stopped at step")
            browser.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines)[-3000:]
    assert os.path.exists(out_dir / "ckpt.pt")
    assert read_log(out_dir)[-1]["kind"] == "end" and read_log(out_dir)[-1]["stopped"]  # the page stops saying live


def test_a_dashboard_port_in_use_is_refused_before_out_dir_is_touched(char_data, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "log.jsonl").write_text('{"kind": "train", "step": 0}\n')  # an earlier run's, to be moved aside
    taken = dashboard.make_server(tmp_path, 0)
    try:
        r = subprocess.run([sys.executable, "train.py", f"--data_dir={char_data}", "--dataset=chars",
                            f"--out_dir={out_dir}", "--dashboard=True",
                            f"--dashboard_port={taken.server_address[1]}", *flags(**tiny(max_iters=2))],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        taken.server_close()
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("error: the dashboard cannot listen on 127.0.0.1:"), r.stderr
    assert os.listdir(out_dir) == ["log.jsonl"] and "note:" not in r.stdout  # nothing moved aside, no lock
