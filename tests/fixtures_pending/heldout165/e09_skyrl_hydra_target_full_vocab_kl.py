# Reviewer: SkyRL-style policy loss. The KL term is an object built from the trainer
# config's Hydra node, kl_loss: {_target_: <module>.FullVocabKL, temperature: 1.0}, by
# a stand-in for hydra.utils.instantiate (the `_target_` string is split on its last
# dot). FullVocabKL is given LOGITS, forms both log-softmaxes and computes the exact
# KL(pi||pi_ref) over the vocabulary at every position of the policy's own sampled
# responses, then sums it over positions. Each position's term has the right gradient
# for that position alone; the sum keeps only the s = t part of the sequence gradient:
# the token-level partial gradient of the sequence KL(pi||pi_ref).
# Verdict: bug, KL003, reported inside FullVocabKL.__call__ on the line computing the
# per-position KL (a same-file helper called from one place, given only logits).
import importlib
from typing import Any

import torch

from skyrl_train.training_batch import TrainingInputBatch
from skyrl_train.utils.ppo_utils import compute_approx_kl

TRAINER_CFG: dict[str, Any] = {
    "algorithm": {
        "eps_clip_low": 0.2,
        "eps_clip_high": 0.2,
        "kl_loss_coef": 0.02,
        "kl_loss": {"_target_": f"{__name__}.FullVocabKL", "temperature": 1.0},
    }
}


def instantiate(node: dict[str, Any]):
    params = {k: v for k, v in node.items() if k != "_target_"}
    module_name, _, cls_name = node["_target_"].rpartition(".")
    return getattr(importlib.import_module(module_name), cls_name)(**params)


class FullVocabKL:
    def __init__(self, temperature: float = 1.0):
        self.temperature = temperature

    def __call__(self, logits, ref_logits, loss_mask):
        logp = torch.log_softmax(logits.float() / self.temperature, dim=-1)
        ref_logp = torch.log_softmax(ref_logits.float() / self.temperature, dim=-1)
        # error: KL003
        kl = (logp.exp() * (logp - ref_logp)).sum(-1)
        return (kl * loss_mask).sum(-1)


class PolicyLoss:
    def __init__(self, cfg: dict[str, Any] = TRAINER_CFG):
        algo = cfg["algorithm"]
        self.clip_low, self.clip_high = algo["eps_clip_low"], algo["eps_clip_high"]
        self.kl_coef = algo["kl_loss_coef"]
        self.kl_loss = instantiate(algo["kl_loss"])

    def __call__(self, logits, ref_logits, response_ids, old_log_probs, advantages, loss_mask):
        log_probs = torch.gather(logits.log_softmax(-1), -1, response_ids.unsqueeze(-1)).squeeze(-1)
        ratio = (log_probs - old_log_probs).exp()
        pg = -torch.min(ratio * advantages, ratio.clamp(1 - self.clip_low, 1 + self.clip_high) * advantages)
        pg_loss = (pg * loss_mask).sum(-1).mean()
        kl = self.kl_loss(logits, ref_logits, loss_mask)
        loss = pg_loss + self.kl_coef * kl.mean()
        return loss, {"policy_loss": pg_loss.item(), "policy_kl": kl.mean().item()}


def ppo_train_step(model, ref_model, batch: TrainingInputBatch, loss_fn: PolicyLoss, optimizer):
    n = batch["response_ids"].size(1)
    logits = model(batch["sequences"], attention_mask=batch["attention_mask"]).logits[:, -n - 1 : -1]
    with torch.no_grad():
        ref_logits = ref_model(batch["sequences"], attention_mask=batch["attention_mask"]).logits[:, -n - 1 : -1]
    loss, status = loss_fn(
        logits, ref_logits, batch["response_ids"], batch["action_log_probs"], batch["advantages"], batch["loss_mask"]
    )
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return status
