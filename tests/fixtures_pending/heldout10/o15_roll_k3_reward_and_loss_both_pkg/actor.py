"""Actor side: REINFORCE on the sequence reward plus the k3 loss in "both" mode."""
import torch

from .kl import low_var_kl
from .pipeline import PipelineConfig


def actor_loss(cfg: PipelineConfig, log_probs, old_log_probs, ref_log_probs, seq_rewards, response_mask):
    ratio = torch.exp(log_probs - old_log_probs)
    pg_loss = -(ratio * seq_rewards[:, None] * response_mask).sum(-1).mean()
    loss = pg_loss
    if cfg.kl_mode in ("loss", "both"):
        # ok: KL002
        kl = low_var_kl(log_probs, ref_log_probs)
        loss = loss + cfg.kl_coef * (kl * response_mask).sum(-1).mean()
    return loss


def train_step(cfg, policy, ref_policy, batch, optimizer):
    from .pipeline import compute_sequence_rewards

    ids = batch["input_ids"]
    log_probs = policy(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    with torch.no_grad():
        ref_log_probs = ref_policy(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    rewards = compute_sequence_rewards(cfg, batch["scores"], log_probs.detach(), ref_log_probs, batch["response_mask"])
    loss = actor_loss(cfg, log_probs, log_probs.detach(), ref_log_probs, rewards, batch["response_mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
