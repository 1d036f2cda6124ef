"""Clipped policy-gradient loss with a reference-policy KL penalty whose estimator is an Enum.

What it shows: `kl.calculate_kl` returns the k3 estimate by default (`KLType.K3`, also the
config default), and `loss.ClippedPGLossFn` differentiates it as a loss term. Per token the
autograd gradient of k3 is (1 - exp(-logr_t)) grad log pi(y_t), whose expectation is the
gradient of KL(pi_ref||pi) (token by token), not of KL(pi||pi_ref): KL002, reported at the
call of `calculate_kl` in the loss.
"""

from .kl import KLType, calculate_kl, masked_mean
from .loss import ClippedPGLossConfig, ClippedPGLossFn

__all__ = ["KLType", "calculate_kl", "masked_mean", "ClippedPGLossConfig", "ClippedPGLossFn"]
