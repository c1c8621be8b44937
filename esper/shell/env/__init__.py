"""The environment: many hosts stepped side by side, the governor, and one batch of episodes (the rollout)."""
