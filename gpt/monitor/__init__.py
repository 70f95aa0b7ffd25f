"""What a run tells while it trains: log.jsonl, the step line and wandb (trainlog), and the live page over
the log (server, with its files in dashboard_static/)."""
