# Review: the learner binds token_kl to --kl-estimator (default "k2") with
# functools.partial and the loss sums the per-token k2 over each response.
# Per token that gradient is right, but summed over a sampled sequence it drops
# the later tokens' KL from each token's weight: a partial gradient.
from .estimators import token_kl
from .losses import regularised_pg_loss
from .learner import PolicyLearner, get_args

__all__ = ["token_kl", "regularised_pg_loss", "PolicyLearner", "get_args"]
