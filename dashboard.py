"""A live web page over a run's log (out_dir/log.jsonl), for a running or finished run (docs/monitoring.md), served
from 127.0.0.1 only (gpt/monitor/server.py says what it answers, and to whom).

$ python dashboard.py --out_dir=out                   # http://127.0.0.1:8000/"""
import os
import sys
from contextlib import suppress

import configurator
from gpt.monitor.server import make_server, url
from gpt.monitor.trainlog import LOG_NAME
from gpt.runtime import errors
from gpt.runtime.settings import PORT, Setting, check

SETTINGS = dict(
    out_dir=Setting(default='out', doc="the run folder, holding log.jsonl"),
    port=Setting(PORT, default=8000, doc="0: any free port"),
    host=Setting(default='127.0.0.1', doc="the address to listen on; only this machine can reach 127.0.0.1"),
)


def main(argv):
    errors.install()
    s = configurator.apply({'__file__': __file__}, argv, SETTINGS)
    check(s, s.declared)  # a port beyond 65535: one line, not socket's OverflowError
    if not os.path.isdir(s['out_dir']):
        raise errors.UserError(f"out_dir {s['out_dir']} does not exist: point --out_dir at a run folder")
    if not os.path.exists(os.path.join(s['out_dir'], LOG_NAME)):
        print(f"note: no {LOG_NAME} in {s['out_dir']} yet; the page fills in once the run writes it")
    server = make_server(s['out_dir'], s['port'], s['host'])
    print(f"dashboard for {s['out_dir']}: {url(server)} (Ctrl-C stops it)", flush=True)
    with suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
