"""Package: KL estimator helper in one module, policy loss in another, estimator chosen by an argparse option in a third."""
from .kl_utils import compute_approx_kl, masked_mean
from .policy_loss import PolicyLoss

__all__ = ["compute_approx_kl", "masked_mean", "PolicyLoss"]
