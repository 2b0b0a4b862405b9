"""layernorm_eps: a LayerNorm epsilon that grows with the log of the batch's token count (README.md)."""
