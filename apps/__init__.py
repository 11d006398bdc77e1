"""Example machine-learning applications that run on the engine."""
