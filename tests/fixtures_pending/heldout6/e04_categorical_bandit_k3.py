"""Single-action candidate selector: k3 on Categorical(...).log_prob written as ratio - log(ratio) - 1."""
import torch
import torch.nn as nn
from torch.distributions import Categorical


class CandidateSelector(nn.Module):
    def __init__(self, hidden_size, num_candidates):
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.Tanh())
        self.head = nn.Linear(hidden_size, num_candidates)

    def forward(self, h):
        return Categorical(logits=self.head(self.proj(h)))


def reinforce_step(policy, ref_policy, optimizer, features, reward_fn, beta=0.1):
    dist = policy(features)
    with torch.no_grad():
        ref_dist = ref_policy(features)
        action = dist.sample()
        reward = reward_fn(features, action)
    logp = dist.log_prob(action)
    ref_logp = ref_dist.log_prob(action)
    ratio = torch.exp(ref_logp - logp)
    # error: KL002
    kl = ratio - torch.log(ratio) - 1
    advantage = reward - reward.mean()
    loss = (-advantage * logp + beta * kl).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "kl": kl.mean().item(), "reward": reward.mean().item()}
