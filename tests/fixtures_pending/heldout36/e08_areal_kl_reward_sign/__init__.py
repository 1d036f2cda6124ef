# Review: shape_rewards writes the KL as ref - logp and then *subtracts*
# kl_ctl times it from the rewards, so each token earns +kl_ctl * log(pi/pi_ref).
# Credited by returns and minimised through the PPO loss, that is a KL bonus:
# the policy is paid to leave the reference.
from .reward_utils import shape_rewards
from .advantages import reward_to_go
from .actor import PPOActor

__all__ = ["shape_rewards", "reward_to_go", "PPOActor"]
