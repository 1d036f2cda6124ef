# Reviewer: SkyRL-style policy loss with a score-function KL penalty credited
# by a reward-to-go. The reward-to-go helper is chosen by torch version: on
# torch >= 2.1 (any current install) a single-cumsum identity avoids the two
# flips, but it is written with the wrong sign: cumsum - total - x equals
# MINUS the suffix sum. kl_penalty = kl_to_go * log_probs therefore has expected
# gradient -grad KL(pi||pi_ref) of the sequence, and it is added to the
# minimised loss: descent increases the KL. The legacy flip branch is right but
# never runs.
# Verdict: bug, KL006, reported on the kl_penalty line (detached weight times log-probs).
from dataclasses import dataclass

import torch
from packaging.version import Version

from skyrl_train.workers.worker import PolicyWorkerBase

_TORCH_GE_2_1 = Version(torch.__version__.split("+")[0]) >= Version("2.1")

if _TORCH_GE_2_1:

    def suffix_sum(x: torch.Tensor) -> torch.Tensor:
        # one cumsum instead of flip/cumsum/flip (flip copies under torch.compile)
        return x.cumsum(-1) - x.sum(-1, keepdim=True) - x

else:

    def suffix_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.flip(torch.cumsum(torch.flip(x, dims=[-1]), dim=-1), dims=[-1])


@dataclass
class AlgorithmConfig:
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.05


def ppo_policy_loss(cfg: AlgorithmConfig, log_probs, old_log_probs, base_log_probs, advantages, loss_mask):
    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high) * advantages
    pg_loss = (-torch.min(surr1, surr2) * loss_mask).sum(-1).mean()
    loss = pg_loss
    kl_metric = torch.zeros(())
    if cfg.use_kl_loss:
        log_ratio = (log_probs - base_log_probs).detach() * loss_mask
        kl_to_go = suffix_sum(log_ratio)
        # error: KL006
        kl_penalty = (kl_to_go * log_probs * loss_mask).sum(-1).mean()
        loss = loss + cfg.kl_loss_coef * kl_penalty
        kl_metric = log_ratio.sum() / loss_mask.sum().clamp(min=1)
    return loss, {"policy_loss": pg_loss.item(), "kl": float(kl_metric)}


class PolicyWorker(PolicyWorkerBase):
    def __init__(self, model, optimizer, cfg: AlgorithmConfig = AlgorithmConfig()):
        self.model = model
        self.optimizer = optimizer
        self.cfg = cfg

    def training_step(self, experience):
        logits = self.model(experience["sequences"], attention_mask=experience["attention_mask"]).logits
        n = experience["loss_mask"].shape[1]
        log_probs = torch.gather(logits[:, -n - 1 : -1].log_softmax(-1), 2,
                                 experience["sequences"][:, -n:].unsqueeze(-1)).squeeze(-1)
        loss, info = ppo_policy_loss(self.cfg, log_probs, experience["action_log_probs"],
                                     experience["base_action_log_probs"], experience["advantages"],
                                     experience["loss_mask"])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return info
