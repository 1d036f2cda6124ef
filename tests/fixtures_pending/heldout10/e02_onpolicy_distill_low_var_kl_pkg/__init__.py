"""On-policy distillation in the style of a verl recipe: the student samples responses,
a frozen teacher scores every sampled token, and the per-token `low_var_kl` (k3) between
student and teacher is minimised as a loss.  Autograd on k3 gives (1 - exp(t - s)) grad s
per token, whose expectation is the token-level gradient of KL(teacher||student) at
student prefixes, not grad KL(student||teacher) (KL002, reported at the call in
`trainer.py`).
"""
from .config import DistillConfig
from .trainer import OnPolicyDistillTrainer

__all__ = ["DistillConfig", "OnPolicyDistillTrainer"]
