# Reviewer: same registry and @LOSSES.register_module() LowVarKLLoss as e04,
# but the default config also turns on the k3 KL *reward* with the same
# coefficient (kl_reward_coef = loss_weight = 0.01): the trainer subtracts
# 0.01 * k3 from the per-token rewards (no grad), credits it by returns (reverse
# cumulative sum), and adds the k3 loss. Reward half: 0.01*(grad KL(pi||pi_ref)
# - token-level grad KL(pi_ref||pi)); loss half: +0.01 * that token-level
# gradient. Their sum is 0.01 * grad KL(pi||pi_ref) of the sequence ("both").
# Verdict: correct. Neither the k3 loss nor the k3 reward is a finding here.
import torch
import torch.nn as nn

from xtuner.rl.utils import gather_logprobs


class Registry:
    def __init__(self, name):
        self.name = name
        self._modules = {}

    def register_module(self, name=None):
        def _register(cls):
            self._modules[name or cls.__name__] = cls
            return cls

        return _register

    def build(self, cfg):
        cfg = dict(cfg)
        return self._modules[cfg.pop("type")](**cfg)


LOSSES = Registry("loss")


@LOSSES.register_module()
class ReturnsPGLoss(nn.Module):
    def forward(self, logprobs, returns, mask):
        return -(returns * logprobs * mask).sum(-1).mean()


@LOSSES.register_module()
class LowVarKLLoss(nn.Module):
    def __init__(self, loss_weight=1.0, clamp=20.0):
        super().__init__()
        self.loss_weight = loss_weight
        self.clamp = clamp

    def forward(self, logprobs, ref_logprobs, mask):
        log_ratio = (ref_logprobs - logprobs).clamp(-self.clamp, self.clamp)
        kl = log_ratio.exp() - log_ratio - 1
        return self.loss_weight * (kl * mask).sum(-1).mean()


DEFAULT_CFG = dict(
    policy_loss=dict(type="ReturnsPGLoss"),
    kl_loss=dict(type="LowVarKLLoss", loss_weight=0.01),
    kl_reward_coef=0.01,
)


class ReinforceTrainer:
    def __init__(self, model, cfg=DEFAULT_CFG):
        self.model = model
        self.policy_loss = LOSSES.build(cfg["policy_loss"])
        self.kl_loss = LOSSES.build(cfg["kl_loss"])
        self.kl_reward_coef = cfg["kl_reward_coef"]

    @torch.no_grad()
    def compute_returns(self, logprobs, ref_logprobs, scores, mask):
        log_ratio = ref_logprobs - logprobs
        # ok: KL004
        kl = log_ratio.exp() - log_ratio - 1
        rewards = -self.kl_reward_coef * kl * mask
        last = mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.shape[0]), last] += scores
        return rewards.flip(-1).cumsum(-1).flip(-1)

    def compute_loss(self, logprobs, ref_logprobs, returns, mask):
        pg_loss = self.policy_loss(logprobs, returns, mask)
        # ok: KL002
        kl_loss = self.kl_loss(logprobs, ref_logprobs, mask)
        return pg_loss + kl_loss, {"kl_loss": kl_loss.item()}

    def train_step(self, batch, optimizer):
        logits = self.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logprobs = gather_logprobs(logits[:, :-1], batch["input_ids"][:, 1:])[:, -batch["mask"].shape[1] :]
        returns = self.compute_returns(logprobs, batch["ref_logprobs"], batch["scores"], batch["mask"])
        loss, info = self.compute_loss(logprobs, batch["ref_logprobs"], returns, batch["mask"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return info
