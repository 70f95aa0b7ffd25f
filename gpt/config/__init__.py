"""The settings (each declared once, with its checks: settings) and the run plan that decides a run from them
before anything is touched (plan)."""
