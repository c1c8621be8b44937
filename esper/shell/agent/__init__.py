"""Tamiyo: the policy network, the agent that acts with it, and its recurrent PPO trainer."""
