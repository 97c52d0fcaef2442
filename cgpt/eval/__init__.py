"""Trained models in use: `cgpt.load`, the lm-evaluation-harness model, the μP coordinate check."""
