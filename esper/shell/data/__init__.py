"""Tasks and their data: the embedded and local datasets, batch iterators, and the task presets."""
