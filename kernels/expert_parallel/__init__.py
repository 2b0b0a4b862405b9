"""Expert parallelism (MoE experts split across ranks, tokens exchanged by all-to-all) against DDP on the same
mixture-of-experts model (see README.md)."""
