"""Leaf helpers every floor above may use: config fields, the CLI convention, checkpoints, the run
directory, torchrun, seeds, the revision and memory. They import nothing from the rest of the shell."""
