"""FP8 (e4m3) FlashAttention forward with per-block scales: the kernel and its plugin."""
