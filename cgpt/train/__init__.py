"""One training run: resolve the run, fit the step, the loop, checkpoints and the run directory."""
