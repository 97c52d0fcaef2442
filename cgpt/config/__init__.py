"""What a run is, before anything runs: model presets, the run config and its overrides, FLOPs,
the published recipe's numbers and the platform table. Imports no JAX."""
