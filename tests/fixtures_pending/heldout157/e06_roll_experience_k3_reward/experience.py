# Part of e06 (see __init__.py).
# Verdict: bug, KL004, on the kl_utils.compute_approx_kl(...) call in make_experience.
import torch

from roll.distributed.scheduler.protocol import DataProto

from . import kl as kl_utils


class ExperienceMaker:
    def __init__(self, pipeline_config, actor_infer=None, reference=None, reward_fn=None):
        self.cfg = pipeline_config
        self.actor_infer = actor_infer
        self.reference = reference
        self.reward_fn = reward_fn
        self.kl_coef = pipeline_config.init_kl_coef

    @torch.no_grad()
    def make_experience(self, old_log_probs, ref_log_probs, scores, response_mask):
        cfg = self.cfg
        if cfg.add_token_level_kl:
            # error: KL004
            kl = kl_utils.compute_approx_kl(old_log_probs, ref_log_probs, kl_estimator=cfg.kl_estimator)
        else:
            kl = torch.zeros_like(old_log_probs)
        token_rewards = kl_utils.compute_token_reward(scores, kl, self.kl_coef, response_mask)
        returns = kl_utils.get_cumulative_returns(token_rewards, response_mask, gamma=cfg.gamma)
        if cfg.whiten_advantages:
            mean = (returns * response_mask).sum() / response_mask.sum()
            returns = (returns - mean) * response_mask
        metrics = {"critic/kl": ((kl * response_mask).sum(-1).mean()).item()}
        return returns, metrics

    def generate(self, batch: DataProto):
        old_log_probs = self.actor_infer.compute_log_probs(batch)
        ref_log_probs = self.reference.compute_log_probs(batch)
        scores = self.reward_fn(batch)
        return self.make_experience(old_log_probs, ref_log_probs, scores, batch["response_mask"])
