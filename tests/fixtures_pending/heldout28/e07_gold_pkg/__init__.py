"""A small GOLD-style distillation package: the student samples completions,
the teacher scores them, and a configurable KL estimator ties them."""

from .config import DistillConfig
from .trainer import GOLDStyleTrainer

__all__ = ["DistillConfig", "GOLDStyleTrainer"]
