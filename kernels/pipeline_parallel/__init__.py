"""Pipeline parallelism (torch.distributed.pipelining, GPipe) against plain DDP on the embedded model
(see README.md)."""
