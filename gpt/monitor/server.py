"""The server behind the live page over a run's log (dashboard.py serves one for any run; train.py, with dashboard=True,
for its own): the page in dashboard_static/ and /log?offset=N, the log's complete rows from byte N on. What it shows,
and why it answers only to the names it is served under (DNS rebinding): docs/monitoring.md#live-dashboard."""
import http.server
import ipaddress
import json
import os
import socket
import threading
import time
import urllib.parse

from gpt.monitor.trainlog import LOG_NAME, parse_rows
from gpt.runtime.errors import UserError
from gpt.runtime.settings import PORT, Setting

# train.py's settings for the live page of its own run, set like train.py's own (gpt/runtime/settings.py)
SETTINGS = dict(
    dashboard=Setting(unused=lambda c: c.get('eval_only', False) and "eval_only writes no log for the page to show",
                      default=False, doc="serve a live page of the run's log on 127.0.0.1 (dashboard.py serves one "
                      "for any run)"),
    dashboard_port=Setting(PORT, unused=lambda c: not c['dashboard'] and "dashboard=False serves no dashboard",
                           default=8000, doc="its port (0: any free port)"),
)
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboard_static")
FILES = {"/": ("index.html", "text/html; charset=utf-8"),  # path -> (file in dashboard_static, content type)
         "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
         "/uPlot.iife.min.js": ("uPlot.iife.min.js", "text/javascript; charset=utf-8"),
         "/uPlot.min.css": ("uPlot.min.css", "text/css; charset=utf-8")}
MAX_CHUNK = 4 << 20  # bytes of log per answer: a long run's page catches up over a few requests
POLLING_S = 3.0  # a page that asked for the log this recently is open (it asks every second)


def read_rows(path, offset):
    """The log's complete rows from byte `offset` on, MAX_CHUNK bytes at most: {offset: the next request's, rows, more:
    more to read now, reset: the log was cut back by a resumed run, rows from the start}."""
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
    return {"offset": offset + len(complete), "rows": parse_rows(complete.splitlines()), "more": more, "reset": reset}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        host = self.headers.get("Host", "")
        if not self.server.serves(host):
            return self.send_error(403, f"this dashboard answers only to the names it is served under, not "
                                        f"{host_name(host) or 'none'} (python dashboard.py --host=NAME serves it "
                                        f"under NAME)")
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/log":
            query = urllib.parse.parse_qs(url.query)
            try:
                offset = max(0, int(query.get("offset", ["0"])[0]))
            except ValueError:
                return self.send_error(400, "offset must be an integer")
            answer = read_rows(self.server.log_path, offset)
            with self.server.pages_lock:
                self.server.pages[query.get("page", [self.client_address[0]])[0]] = (time.monotonic(), answer["offset"])
            try:  # seconds since the log last changed: a run without an "end" row, quiet for long, is not live
                idle = None if self.server.training else max(0.0, time.time() - os.path.getmtime(self.server.log_path))
            except OSError:  # no log yet
                idle = None
            return self.reply(json.dumps({**answer, "run": self.server.run_name, "idle_s": idle}).encode(),
                              "application/json")
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


def host_name(header):
    """The name in a Host header ('name:port', '[::1]:port', 'name'), lower case, without a final dot."""
    header = header.strip().lower()
    if header.startswith("["):
        name = header[1:header.find("]")]
    else:
        name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    return name.rstrip(".")


class Server(http.server.ThreadingHTTPServer):
    """The dashboard's HTTP server for one run folder: bound (its port taken) when made, serving once started."""

    daemon_threads = True

    def __init__(self, address, out_dir, training=False):
        super().__init__(address, Handler)
        self.log_path = os.path.join(out_dir, LOG_NAME)
        self.run_name = os.path.basename(os.path.abspath(out_dir))
        self.training = training  # served by the training process itself: live while it answers, however quiet
        host = address[0].lower().strip("[]")
        self.names = {"localhost", host} - {""}  # and any IP address (serves)
        if host in ("", "0.0.0.0", "::"):  # every address of this machine: also its name
            self.names.add(socket.gethostname().lower())
        self.pages = {}  # page -> (when it last asked for the log, the offset it has read to)
        self.pages_lock = threading.Lock()
        self.serving = False

    def serves(self, host):
        """Whether a request with this Host header is addressed to this server, not to a name pointed at it."""
        name = host_name(host)
        try:
            ipaddress.ip_address(name)  # any IP address: a rebinding page has a name, not an address
            return True
        except ValueError:
            return name in self.names

    def finish(self, timeout=5.0):
        """The run is over: wait up to `timeout` s for every polling page to read the log to its end, then stop."""
        end = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pages_behind(end):
            time.sleep(0.05)
        if self.serving:
            self.shutdown()
            self.serving = False
        self.server_close()

    def pages_behind(self, end):
        """Whether a page open now (asked within POLLING_S) has not read the log up to byte `end`."""
        now = time.monotonic()
        with self.pages_lock:
            return any(now - when < POLLING_S and offset < end for when, offset in self.pages.values())


def make_server(out_dir, port=8000, host="127.0.0.1", training=False):
    """The dashboard's server for out_dir, not yet serving, its port taken now: a port in use is a UserError."""
    try:
        return Server((host, port), out_dir, training)
    except (OSError, OverflowError) as e:  # in use, no such address; OverflowError: a port beyond 65535
        raise UserError(f"the dashboard cannot listen on {host}:{port} ({getattr(e, 'strerror', None) or e}): "
                        f"pick another port (0: any free one)")


def url(server):
    host, port = server.server_address[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def start(server):
    """Serve the page from a background thread (it ends with the process, or at server.finish()), and say
    where. It polls every 0.1 s for shutdown, not serve_forever's 0.5: a run's end waits on it."""
    threading.Thread(target=server.serve_forever, args=(0.1,), name="dashboard", daemon=True).start()
    server.serving = True
    print(f"dashboard: {url(server)} (live while training; afterwards `python dashboard.py "
          f"--out_dir={os.path.dirname(server.log_path)}`)", flush=True)
    return server
