"""One training step (step) and its CUDA-graph replay (stepgraph), the learning-rate schedule and what is due
at a step (schedule), loss estimates and samples (evaluation), and HellaSwag (hellaswag_eval)."""
