"""
The server behind the live page over a run's log (dashboard.py serves one for any run; train.py, with
dashboard=True, for its own): the page in gpt/dashboard_static/ (uPlot, no network needed), and /log?offset=N,
which answers the log's complete rows from byte N on and the offset to ask from next time. Only 127.0.0.1 by
default. Served by the run itself the page says "live" until the log's "end" row; served by dashboard.py,
also "quiet" once the log has had no rows for minutes (a crashed or killed run).
"""
import http.server
import json
import os
import threading
import time
import urllib.parse

from gpt.errors import UserError
from gpt.trainlog import LOG_NAME

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboard_static")
FILES = {  # path -> (file in dashboard_static, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/uPlot.iife.min.js": ("uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/uPlot.min.css": ("uPlot.min.css", "text/css; charset=utf-8"),
}
MAX_CHUNK = 4 << 20  # bytes of log per answer: a long run's page catches up over a few requests


def read_rows(path, offset):
    """The log's complete rows from byte `offset` on, at most MAX_CHUNK bytes of them: {offset: where the next
    request starts, rows, more: whether there is more to read already, reset}. A log shorter than offset was
    cut back by a resumed run (it drops the rows after its checkpoint): then the rows come from the start,
    with reset true, so the page starts over."""
    reset = False
    try:
        with open(path, "rb") as f:
            if offset > os.fstat(f.fileno()).st_size:
                offset, reset = 0, True
            f.seek(offset)
            data = f.read(MAX_CHUNK)
            more = len(data) == MAX_CHUNK
            if more and b"\n" not in data:
                data += f.readline()  # a row longer than a chunk
    except FileNotFoundError:
        return {"offset": 0, "rows": [], "more": False, "reset": offset > 0}
    complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next request
    rows = []
    for line in complete.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return {"offset": offset + len(complete), "rows": rows, "more": more, "reset": reset}


def idle_seconds(path):
    """Seconds since the log last changed (None when there is none): the page says a run without an "end" row
    that has been quiet for long is no longer live."""
    try:
        return max(0.0, time.time() - os.path.getmtime(path))
    except OSError:
        return None


class Handler(http.server.BaseHTTPRequestHandler):

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/log":
            try:
                offset = max(0, int(urllib.parse.parse_qs(url.query).get("offset", ["0"])[0]))
            except ValueError:
                return self.send_error(400, "offset must be an integer")
            body = json.dumps({**read_rows(self.server.log_path, offset), "run": self.server.run_name,
                               "idle_s": None if self.server.training else idle_seconds(self.server.log_path)})
            body = body.encode()
            return self.reply(body, "application/json")
        if url.path == "/favicon.ico":  # the page links none (data:), but some browsers ask anyway
            self.send_response(204)
            return self.end_headers()
        if url.path not in FILES:
            return self.send_error(404)
        name, content_type = FILES[url.path]
        with open(os.path.join(STATIC, name), "rb") as f:
            self.reply(f.read(), content_type)

    def reply(self, body, content_type):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass  # a request every second would drown the training's own output


def make_server(out_dir, port=8000, host="127.0.0.1"):
    try:
        server = http.server.ThreadingHTTPServer((host, port), Handler)
    except (OSError, OverflowError) as e:  # in use, no such address; OverflowError: a port beyond 65535
        raise UserError(f"the dashboard cannot listen on {host}:{port} ({getattr(e, 'strerror', None) or e}): "
                        f"pick another port (0: any free one)")
    server.daemon_threads = True
    server.log_path = os.path.join(out_dir, LOG_NAME)
    server.run_name = os.path.basename(os.path.abspath(out_dir))
    server.training = False  # served by the training process itself: live while it answers, however quiet
    return server


def url(server):
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"


def start_dashboard(out_dir, port=8000, host="127.0.0.1", training=False):
    """Serve the page for out_dir from a background thread (it ends with the process); returns the server.
    training: this process is the run (its log may be quiet for long, during a long evaluation, and still live)."""
    server = make_server(out_dir, port, host)
    server.training = training
    threading.Thread(target=server.serve_forever, name="dashboard", daemon=True).start()
    print(f"dashboard: {url(server)} (live while training; afterwards `python dashboard.py --out_dir={out_dir}`)",
          flush=True)
    return server
