"""grad_checkpoint: recompute transformer blocks in backward instead of storing their activations (README.md)."""
