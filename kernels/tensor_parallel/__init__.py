"""Megatron-style tensor parallelism (DTensor) against plain DDP on the embedded model (see README.md)."""
