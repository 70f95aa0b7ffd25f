"""What every script runs on: one-line errors (errors), Ctrl-C / SIGTERM / SIGHUP (signals), files written whole
and never through a link (files), files from outside read as data only (untrusted), the settings' declarations
(settings), the device and dtype (hardware), and torchrun's processes (distributed)."""
