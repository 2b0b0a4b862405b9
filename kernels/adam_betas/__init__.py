"""adam_betas: AdamW beta1 0.9 / eps 1e-8 vs beta1 0.95 / eps 1e-6 (README.md)."""
