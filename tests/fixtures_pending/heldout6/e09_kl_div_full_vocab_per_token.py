"""Exact full-vocabulary KL per position via F.kl_div(ref, policy, log_target=True), averaged over response tokens."""
import torch
import torch.nn.functional as F


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


class FullVocabKLPolicyLoss(torch.nn.Module):
    def __init__(self, kl_coef=0.1, clip_eps=0.2):
        super().__init__()
        self.kl_coef = kl_coef
        self.clip_eps = clip_eps

    def forward(self, logits, ref_logits, actions, old_log_probs, advantages, action_mask):
        log_probs_all = F.log_softmax(logits.float(), dim=-1)
        ref_log_probs_all = F.log_softmax(ref_logits.float(), dim=-1).detach()
        log_probs = log_probs_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        ratio = (log_probs - old_log_probs).exp()
        surr = torch.min(ratio * advantages, ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages)
        # error: KL003
        per_position_kl = F.kl_div(ref_log_probs_all, log_probs_all, reduction="none", log_target=True).sum(-1)
        loss = masked_mean(-surr + self.kl_coef * per_position_kl, action_mask)
        return loss


def train_step(actor, ref_actor, loss_fn, optimizer, batch):
    logits = actor(batch["sequences"]).logits[:, -batch["actions"].size(1) - 1 : -1]
    with torch.no_grad():
        ref_logits = ref_actor(batch["sequences"]).logits[:, -batch["actions"].size(1) - 1 : -1]
    loss = loss_fn(
        logits, ref_logits, batch["actions"], batch["old_log_probs"], batch["advantages"], batch["action_mask"]
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()
