"""The host networks, their seed slots, the blueprint registry, and host training (optimizers, epoch
loops)."""
