"""Sequence-level score-function KL with anonymous names (oat-like)."""
import torch


def f(m, x, k):
    z = m(x).logits[:, -k - 1 : -1]
    return z.log_softmax(-1).gather(-1, x[:, -k:].unsqueeze(-1)).squeeze(-1)


def learn(m, m0, opt, x, w, r, beta=0.05):
    k = w.size(1)
    a = f(m, x, k)
    with torch.no_grad():
        b = f(m0, x, k)
    s = (a * w).sum(-1)
    # ok: KL001, KL003
    c = ((a - b) * w).sum(-1).detach()
    loss = (-(r * s) + beta * c * s).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
