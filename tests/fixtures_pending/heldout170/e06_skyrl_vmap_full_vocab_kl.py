# Reviewer: SkyRL-style policy loss with an exact, full-vocabulary KL term. The
# loss helper full_vocab_kl is given the policy and reference LOGITS of the
# on-policy rollouts; torch.func.vmap(vmap(_position_kl)) maps over batch and
# position, and _position_kl forms the log-probs and the exact per-position
# KL(pi||pi_ref) = sum_v p_v (log p_v - log q_v). Summed over the positions of a
# sequence sampled from pi this is the token-level (partial) gradient of the
# sequence KL: each position's KL is pulled down, the later tokens' KL does not
# enter the earlier tokens' credit.
# Verdict: bug, KL003, reported inside _position_kl on the line that computes the
# per-position KL (the helper is given logits, not log-probs).
import torch
from torch.func import vmap

from skyrl_train.utils.ppo_utils import PolicyLossRegistry
from skyrl_train.training_batch import TrainingInputBatch


def _position_kl(logits, ref_logits):
    logp = torch.log_softmax(logits, dim=-1)
    ref_logp = torch.log_softmax(ref_logits, dim=-1)
    # error: KL003
    return (logp.exp() * (logp - ref_logp)).sum(-1)


def full_vocab_kl(logits, ref_logits, loss_mask):
    per_position = vmap(vmap(_position_kl))(logits, ref_logits)
    return (per_position * loss_mask).sum(-1).mean()


class FullVocabKLPolicyLoss:
    def __init__(self, eps_clip_low=0.2, eps_clip_high=0.28, kl_loss_coef=0.02):
        self.eps_clip_low = eps_clip_low
        self.eps_clip_high = eps_clip_high
        self.kl_loss_coef = kl_loss_coef

    def __call__(self, log_probs, old_log_probs, advantages, loss_mask, logits, ref_logits):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.eps_clip_low, 1 + self.eps_clip_high) * advantages
        pg_loss = (-torch.min(surr1, surr2) * loss_mask).sum(-1).mean()
        kl_loss = full_vocab_kl(logits, ref_logits, loss_mask)
        loss = pg_loss + self.kl_loss_coef * kl_loss
        return loss, {"policy_loss": pg_loss.item(), "policy_kl": kl_loss.item()}


def ppo_train_step(policy, ref_policy, optimizer, batch: TrainingInputBatch, loss_fn: FullVocabKLPolicyLoss):
    num_actions = batch["response_mask"].shape[1]
    logits = policy(batch["sequences"], attention_mask=batch["attention_mask"]).logits[:, -num_actions - 1 : -1]
    with torch.no_grad():
        ref_logits = ref_policy(batch["sequences"], attention_mask=batch["attention_mask"]).logits
        ref_logits = ref_logits[:, -num_actions - 1 : -1]
    actions = batch["sequences"][:, -num_actions:]
    log_probs = torch.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    loss, status = loss_fn(
        log_probs, batch["action_log_probs"], batch["advantages"], batch["loss_mask"], logits, ref_logits
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return status
