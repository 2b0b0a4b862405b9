"""Planted crashes: candidates that abort, segfault, hang, exhaust memory or poison the CUDA context."""
