"""What keeps a run safe: the CLI convention, checkpoints, the run directory's lock and signals, torchrun."""
