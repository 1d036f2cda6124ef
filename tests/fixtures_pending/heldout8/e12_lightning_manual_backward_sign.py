"""LightningModule with manual optimisation; KL-to-go built from ref - logp (bug: KL006).

The penalty is the right estimator, the score function with a reward-to-go
G_t = sum_{s>=t} sg(logr_s), but the log-ratio is written the wrong way round,
``prior_lp - lp``. So the term is sum_t G'_t * logp_t with G'_t = -G_t: its
expected gradient is -grad KL(pi||pi_ref). Added with +kl_coef to a loss passed
to ``manual_backward``, it pushes the policy away from the prior.
"""

import lightning as L
import torch


class KLRegularisedPolicyGradient(L.LightningModule):
    def __init__(self, policy, prior, kl_coef: float = 0.05, lr: float = 1e-6):
        super().__init__()
        self.policy = policy
        self.prior = prior.eval().requires_grad_(False)
        self.kl_coef = kl_coef
        self.lr = lr
        self.automatic_optimization = False

    def configure_optimizers(self):
        return torch.optim.AdamW(self.policy.parameters(), lr=self.lr)

    def token_logprobs(self, model, tokens, prompt_len):
        logits = model(tokens).logits[:, prompt_len - 1 : -1]
        return logits.log_softmax(-1).gather(-1, tokens[:, prompt_len:, None]).squeeze(-1)

    def kl_penalty(self, lp, prior_lp, mask):
        log_ratio = ((prior_lp - lp) * mask).detach()
        kl_to_go = torch.flip(torch.cumsum(torch.flip(log_ratio, dims=[-1]), dim=-1), dims=[-1])
        # error: KL006
        kl_term = (kl_to_go * lp * mask).sum(-1).mean()
        return kl_term

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        tokens, prompt_len, mask, rewards = batch["tokens"], batch["prompt_len"], batch["mask"], batch["rewards"]
        lp = self.token_logprobs(self.policy, tokens, prompt_len)
        with torch.no_grad():
            prior_lp = self.token_logprobs(self.prior, tokens, prompt_len)

        adv = rewards - rewards.mean()
        pg_loss = -(adv[:, None] * lp * mask).sum(-1).mean()
        kl_term = self.kl_penalty(lp, prior_lp, mask)
        loss = pg_loss + self.kl_coef * kl_term

        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.log_dict({"train/pg_loss": pg_loss, "train/kl_term": kl_term}, prog_bar=True)
        return loss
