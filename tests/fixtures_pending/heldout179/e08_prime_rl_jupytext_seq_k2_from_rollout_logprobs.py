# Reviewer: jupytext notebook in the style of a prime-rl tutorial: a rollout
# cell collects samples and their log-probs under no_grad, a loss cell defines
# `loss_fn`, a training cell really updates a toy policy. The KL loss uses the
# right estimator (k2 of the SEQUENCE log-ratio) but builds it from
# `batch["old_logps"]`, the rollout log-probs recorded under no_grad, instead
# of the fresh `logps`: the KL term is a constant for autograd, its gradient is
# exactly zero, and beta does nothing while the logs show a KL.
# Verdict: bug, KL005, reported on the line of `loss_fn` that computes
# `seq_kl` from the rollout log-probs.

# %% [markdown]
# ## On-policy RL with a sequence-level KL (prime-rl style)

# %%
import torch

from prime_rl.trainer.rl.loss import compute_loss  # noqa: F401  (the production loss)

torch.manual_seed(0)
VOCAB, HORIZON, EOS, BATCH, BETA, NUM_STEPS = 4, 4, 0, 64, 0.1, 300

# %%
class TabularPolicy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.randn((VOCAB + 1) ** HORIZON, VOCAB))

    def prefix_ids(self, seqs):
        ids, code = torch.zeros_like(seqs), torch.zeros(seqs.shape[0], dtype=torch.long)
        for t in range(seqs.shape[1]):
            ids[:, t], code = code, code * (VOCAB + 1) + seqs[:, t] + 1
        return ids

    def token_logps(self, seqs):
        return self.logits[self.prefix_ids(seqs)].log_softmax(-1).gather(-1, seqs[..., None]).squeeze(-1)


policy, reference = TabularPolicy(), TabularPolicy().requires_grad_(False)
optimizer = torch.optim.SGD(policy.parameters(), lr=0.3)

# %%
@torch.no_grad()
def rollout(n=BATCH):
    seqs = torch.zeros(n, HORIZON, dtype=torch.long)
    for t in range(HORIZON):
        probs = policy.logits[policy.prefix_ids(seqs)[:, t]].softmax(-1)
        seqs[:, t] = torch.multinomial(probs, 1).squeeze(-1)
    ended = (seqs == EOS).long().cumsum(-1) - (seqs == EOS).long()
    mask = (ended == 0).float()
    scores = ((seqs == 3).float() * mask).sum(-1)
    return {"seqs": seqs, "mask": mask, "scores": scores,
            "old_logps": policy.token_logps(seqs), "ref_logps": reference.token_logps(seqs)}

# %%
def loss_fn(logps, batch, beta=BETA):
    mask = batch["mask"]
    adv = (batch["scores"] - batch["scores"].mean()).unsqueeze(-1)
    ratio = torch.exp(logps - batch["old_logps"])
    pg_loss = -(ratio * adv * mask).sum(-1).mean()
    # error: KL005
    seq_kl = ((batch["old_logps"] - batch["ref_logps"]) * mask).sum(-1)
    kl_loss = 0.5 * (seq_kl**2).mean()
    return pg_loss + beta * kl_loss, {"kl": seq_kl.mean().item()}

# %%
for step in range(NUM_STEPS):
    batch = rollout()
    loss, stats = loss_fn(policy.token_logps(batch["seqs"]), batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(step, batch["scores"].mean().item(), stats["kl"])
