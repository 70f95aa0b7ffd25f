"""What every script runs on: one-line errors (errors), Ctrl-C / SIGTERM / SIGHUP (signals), files written whole
and never through a link (files), the device and dtype (hardware), and torchrun's processes (distributed)."""
