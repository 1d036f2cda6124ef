# Reviewer: rollout side. Everything here runs under torch.no_grad(): the
# per-sequence k3 below is a detached number. Storing it for logging would be
# fine; learner.py adds it to the loss, so this estimate is a KL penalty with
# no gradient (KL005, reported here where it is computed).
"""Builds experiences: sampling, log-probs, outcome rewards, group advantages."""

import torch

from .experience import Experience


def sequence_log_probs(model, sequences, attention_mask, num_actions):
    logits = model(sequences, attention_mask=attention_mask).logits[:, -num_actions - 1 : -1]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, sequences[:, -num_actions:].unsqueeze(-1)).squeeze(-1)


class ExperienceMaker:
    def __init__(self, policy, ref_model, reward_fn, group_size: int = 8, eps: float = 1e-6):
        self.policy = policy
        self.ref_model = ref_model
        self.reward_fn = reward_fn
        self.group_size = group_size
        self.eps = eps

    def group_advantages(self, scores: torch.Tensor) -> torch.Tensor:
        grouped = scores.view(-1, self.group_size)
        mean = grouped.mean(dim=1, keepdim=True)
        std = grouped.std(dim=1, keepdim=True) if self.group_size > 1 else torch.ones_like(mean)
        return ((grouped - mean) / (std + self.eps)).view(-1)

    @torch.no_grad()
    def make_experience(self, sequences, attention_mask, action_mask) -> Experience:
        num_actions = action_mask.size(1)
        action_log_probs = sequence_log_probs(self.policy, sequences, attention_mask, num_actions)
        ref_log_probs = sequence_log_probs(self.ref_model, sequences, attention_mask, num_actions)

        scores = self.reward_fn(sequences, attention_mask).float()
        advantages = self.group_advantages(scores).unsqueeze(1) * action_mask

        # error: KL005
        per_token_kl = torch.exp(ref_log_probs - action_log_probs) - (ref_log_probs - action_log_probs) - 1
        seq_kl = (per_token_kl * action_mask).sum(dim=-1)

        info = {
            "kl": seq_kl,
            "score": scores,
            "response_length": action_mask.sum(dim=-1).float(),
        }
        return Experience(sequences, attention_mask, action_mask, action_log_probs, ref_log_probs, advantages, info)
