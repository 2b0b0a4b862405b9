"""Data-parallel scaling: DDP on N ranks against one process on the same global batches (see README.md)."""
