# Reviewer: jupytext notebook from the same verl write-up as e03, the
# "benchmark" page: it times the forward and backward of the same
# `kl_low_var` / `loss_fn` pair with torch.utils.benchmark on random leaf
# tensors (`logp = torch.randn(..., requires_grad=True)`), checks the autograd
# gradient against the closed form (1 - exp(ref - logp)) * mask / B, and
# throws the gradient away. There is no policy, no parameter update and no
# optimizer: a differentiated k3 here measures speed, it trains nothing.
# Verdict: correct (not training). The `kl_low_var` call inside `loss_fn`, the
# same line that is a bug in e03, must stay silent.

# %% [markdown]
# ## Benchmark: low_var_kl forward + backward
# How much does the KL loss cost next to the policy-gradient term?

# %%
import torch
import torch.utils.benchmark as benchmark

from verl.trainer.ppo.core_algos import kl_penalty  # noqa: F401  (the library version)

torch.manual_seed(0)
SHAPES = [(8, 512), (64, 2048)]
BETA = 0.2

# %%
def kl_low_var(logp, ref_logp):
    ratio = torch.exp(ref_logp - logp)
    return ratio - torch.log(ratio) - 1


def loss_fn(logp, ref_logp, advantages, mask, beta=BETA):
    ratio = torch.exp(logp - logp.detach())
    pg = -(ratio * advantages.unsqueeze(-1) * mask).sum(-1)
    # ok: KL002
    kl = kl_low_var(logp, ref_logp)
    return (pg + beta * (kl * mask).sum(-1)).mean()


def fwd_bwd(logp, ref_logp, advantages, mask):
    loss = loss_fn(logp, ref_logp, advantages, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    return grad

# %% [markdown]
# Sanity check first: with zero advantages the gradient is the k3 one.

# %%
logp = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
ref_logp = torch.randn(4, 16, dtype=torch.float64)
mask = (torch.rand(4, 16) > 0.2).double()
grad = fwd_bwd(logp, ref_logp, torch.zeros(4, dtype=torch.float64), mask)
expected = BETA * (1 - torch.exp(ref_logp - logp.detach())) * mask / 4
torch.testing.assert_close(grad, expected)

# %%
results = []
for B, T in SHAPES:
    logp = torch.randn(B, T, requires_grad=True)
    inputs = dict(logp=logp, ref_logp=torch.randn(B, T), advantages=torch.randn(B), mask=torch.ones(B, T))
    timer = benchmark.Timer(
        stmt="fwd_bwd(logp, ref_logp, advantages, mask)",
        globals={"fwd_bwd": fwd_bwd, **inputs},
        label="low_var_kl",
        sub_label=f"B={B} T={T}",
        description="fwd+bwd",
    )
    results.append(timer.blocked_autorange(min_run_time=0.2))

# %%
benchmark.Compare(results).print()
