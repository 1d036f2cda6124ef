"""kllint: find KL-divergence regularisers whose gradient is wrong in RL code."""

__version__ = "0.1.0"
