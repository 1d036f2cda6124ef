"""Single-action candidate selector: exact KL(pi||pi_ref) over all candidates via F.kl_div(ref, policy, log_target=True)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical


class CandidateSelector(nn.Module):
    def __init__(self, hidden_size, num_candidates):
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.Tanh())
        self.head = nn.Linear(hidden_size, num_candidates)

    def forward(self, h):
        return self.head(self.proj(h))


def reinforce_step(policy, ref_policy, optimizer, features, reward_fn, beta=0.1):
    logits = policy(features)
    with torch.no_grad():
        ref_logits = ref_policy(features)
    dist = Categorical(logits=logits)
    action = dist.sample()
    logp = dist.log_prob(action)
    with torch.no_grad():
        reward = reward_fn(features, action)
    log_pi = F.log_softmax(logits, dim=-1)
    log_ref = F.log_softmax(ref_logits, dim=-1)
    # ok: KL001,KL002,KL003
    kl = F.kl_div(log_ref, log_pi, reduction="batchmean", log_target=True)
    advantage = reward - reward.mean()
    loss = -(advantage * logp).mean() + beta * kl
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "kl": kl.item(), "reward": reward.mean().item()}
