# Reviewer: OpenRLHF-style REINFORCE++ experience maker (user code). Transcribed
# from InstructGPT's Eq. (2) with the KL switched to Schulman's k3 "because it is
# always positive": r_t = -beta * k3_t, plus the score on the last token;
# returns G_t = sum_{s>=t} r_s are written as an einsum with an upper-triangular
# matrix, and the loss is the policy gradient weighted by G.
# Verdict: bug, KL004. A k3 reward credited by returns has expected gradient
# grad KL(pi || pi_ref) minus the token-level gradient of KL(pi_ref || pi):
# biased, and nearly no force near the reference.
import torch
from openrlhf.models.utils import masked_mean
from openrlhf.trainer.ppo_utils.experience_maker import Experience


@torch.no_grad()
def make_returns(lp_old, lq, R, m, beta=0.01):
    """lp_old, lq, m: [B, T] (rollout and reference log-probs); R: [B] scores."""
    B, T = m.shape
    # ok: KL001
    x = (lp_old - lq) * m
    # k3 (Schulman 2020): exp(-x) + x - 1 >= 0
    # error: KL004
    c = (torch.exp(-x) + x - 1) * m
    r = -beta * c
    last = m.sum(-1).long() - 1
    r[torch.arange(B), last] += R
    U = torch.triu(torch.ones(T, T, dtype=r.dtype, device=r.device))  # U[t, s] = 1 if s >= t
    G = torch.einsum("ts,bs->bt", U, r)
    return G, c


def policy_loss(lp, lp_old, G, m, eps=0.2):
    # REINFORCE++: returns as advantages, PPO clip on the ratio
    rho = torch.exp(lp - lp_old)
    return (-torch.min(rho * G, rho.clamp(1 - eps, 1 + eps) * G) * m).sum(-1).mean()


class ReinforcePPTrainer:
    def __init__(self, actor, ref, opt, args):
        self.actor, self.ref, self.opt, self.args = actor, ref, opt, args

    def make_experience(self, seqs, y, m, R):
        with torch.no_grad():
            lp_old = self.actor.logprobs(seqs, y)
            lq = self.ref.logprobs(seqs, y)
        G, c = make_returns(lp_old, lq, R, m, self.args.init_kl_coef)
        return Experience(sequences=seqs, action_mask=m, returns=G, action_log_probs=lp_old,
                          info={"kl": masked_mean(c, m, dim=-1)})

    def training_step(self, exp):
        self.opt.zero_grad()
        lp = self.actor.logprobs(exp.sequences, exp.y)
        loss = policy_loss(lp, exp.action_log_probs, exp.returns, exp.action_mask, self.args.eps_clip)
        loss.backward()
        self.opt.step()
        return {"policy_loss": loss.item(), "kl": exp.info["kl"].mean().item()}
