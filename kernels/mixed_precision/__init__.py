"""mixed_precision: fp32 training vs bf16 autocast vs fp16 autocast with a GradScaler (README.md)."""
