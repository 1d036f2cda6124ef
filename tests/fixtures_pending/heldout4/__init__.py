"""Held-out fixtures in the style of several RL trainers (parsed by the tests, never executed)."""
