"""ZeRO-style sharding with FSDP2 against plain DDP on the embedded model (see README.md)."""
