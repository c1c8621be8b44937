"""The run's configuration: frozen, slotted dataclasses with a doc line per field, and the presets."""
