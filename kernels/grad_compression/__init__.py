"""Gradient compression as DDP communication hooks against plain DDP on the embedded model (see README.md)."""
