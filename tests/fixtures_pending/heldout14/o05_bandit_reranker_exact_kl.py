"""A listwise re-ranker trained as a contextual bandit.

For each prompt the policy picks ONE of ``N`` pre-generated candidate
responses (the whole episode is a single action); a reward model scores the
pick. The KL to the frozen SFT re-ranker is computed exactly over the ``N``
candidates, so it needs no sampling.
"""

import torch
import torch.nn as nn


class CandidateScorer(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Bilinear(hidden_size, hidden_size, 1)

    def forward(self, prompt_emb, cand_emb):
        # prompt_emb: [B, H], cand_emb: [B, N, H] -> logits over candidates [B, N]
        prompt = prompt_emb.unsqueeze(1).expand_as(cand_emb).contiguous()
        return self.proj(prompt, cand_emb).squeeze(-1)


def reranker_update(policy, ref_policy, optimizer, prompt_emb, cand_emb, cand_rewards, beta=0.1):
    logits = policy(prompt_emb, cand_emb)
    log_pi = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():
        log_pi_ref = torch.log_softmax(ref_policy(prompt_emb, cand_emb), dim=-1)

    dist = torch.distributions.Categorical(logits=logits.detach())
    action = dist.sample()
    log_pi_a = log_pi.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    reward = cand_rewards.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    baseline = (log_pi.detach().exp() * cand_rewards).sum(-1)
    pg_loss = -((reward - baseline) * log_pi_a).mean()

    # exact KL(pi || pi_ref) over the candidate set of each prompt
    # ok: KL003
    kl = (log_pi.exp() * (log_pi - log_pi_ref)).sum(-1)
    loss = pg_loss + beta * kl.mean()

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "kl": kl.mean().item(), "reward": reward.mean().item()}
