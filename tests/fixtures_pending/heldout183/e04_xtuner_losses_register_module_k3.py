# Reviewer: OpenMMLab/xtuner-style RL loss built from a registry: the class
# decorator @LOSSES.register_module() registers LowVarKLLoss, and the trainer
# builds it from the config dict(type="LowVarKLLoss", loss_weight=0.01). Its
# forward computes the per-token k3 from the log-probs it is given, with their
# gradient, and sums it over tokens. The expected gradient is the token-level
# gradient of KL(pi_ref||pi).
# Verdict: bug, KL002, reported where compute_loss calls self.kl_loss(...).
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
class PPOClipLoss(nn.Module):
    def __init__(self, clip_eps=0.2):
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, logprobs, old_logprobs, advantages, mask):
        ratio = (logprobs - old_logprobs).exp()
        loss = -torch.min(ratio * advantages, ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages)
        return (loss * mask).sum(-1).mean()


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
    policy_loss=dict(type="PPOClipLoss", clip_eps=0.2),
    kl_loss=dict(type="LowVarKLLoss", loss_weight=0.01),
)


class GRPOTrainer:
    def __init__(self, model, cfg=DEFAULT_CFG):
        self.model = model
        self.policy_loss = LOSSES.build(cfg["policy_loss"])
        self.kl_loss = LOSSES.build(cfg["kl_loss"])

    def compute_loss(self, logprobs, old_logprobs, ref_logprobs, advantages, mask):
        pg_loss = self.policy_loss(logprobs, old_logprobs, advantages, mask)
        # error: KL002
        kl_loss = self.kl_loss(logprobs, ref_logprobs, mask)
        return pg_loss + kl_loss, {"kl_loss": kl_loss.item()}

    def train_step(self, batch, optimizer):
        logits = self.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logprobs = gather_logprobs(logits[:, :-1], batch["input_ids"][:, 1:])[:, -batch["mask"].shape[1] :]
        loss, info = self.compute_loss(logprobs, batch["old_logprobs"], batch["ref_logprobs"], batch["advantages"], batch["mask"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return info
