"""Real ranks: the same SPMD function in N processes with torch.distributed (gloo, NCCL, torchrun)."""
