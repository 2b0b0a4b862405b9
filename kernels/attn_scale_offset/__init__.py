"""attn_scale_offset: attention scores divided by sqrt(d) + 0.07 instead of sqrt(d) (README.md)."""
