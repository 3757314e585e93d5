"""Measuring: retrieval, the compatibility matrix, metrics, leaderboards and plots (independent of strategies)."""
