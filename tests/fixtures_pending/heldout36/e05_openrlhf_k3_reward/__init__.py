# Review: config/ppo.yaml switches the in-reward KL to kl_estimator: k3.
# compute_reward turns that estimate into per-token rewards, credited by
# returns. As a score-function weight k3 gives grad KL(pi||ref) minus (the
# token-level part of) grad KL(ref||pi): the penalty barely pulls back.
from .utils import compute_approx_kl, compute_reward, get_cumulative_returns
from .experience import ExperienceMaker, load_ppo_config
from .trainer import reinforce_step

__all__ = ["compute_approx_kl", "compute_reward", "get_cumulative_returns", "ExperienceMaker", "load_ppo_config", "reinforce_step"]
