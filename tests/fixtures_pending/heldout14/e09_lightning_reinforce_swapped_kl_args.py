"""REINFORCE with a per-token KL reward, as a LightningModule with manual optimisation.

The KL penalty against the initial policy is placed in the per-token rewards
(NeMo-Aligner's ``calculate_kl_penalty`` convention) and credited by returns.
"""

import lightning.pytorch as pl
import torch
import torch.nn.functional as F


def calculate_kl_penalty(log_probs_a, log_probs_b, use_absolute_kl=False):
    """Per-token estimate of KL(a || b) on tokens sampled from a: log p_a - log p_b."""
    init_policy_kl = log_probs_a - log_probs_b
    if use_absolute_kl:
        init_policy_kl = init_policy_kl.abs()
    return init_policy_kl


def discounted_returns(rewards, mask, gamma=1.0):
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running * mask[:, t]
        returns[:, t] = running
    return returns


class KLRegularisedReinforce(pl.LightningModule):
    def __init__(self, policy, init_policy, kl_coef=0.05, use_absolute_kl=False, lr=1e-6):
        super().__init__()
        self.policy = policy
        self.init_policy = init_policy.requires_grad_(False)
        self.kl_coef = kl_coef
        self.use_absolute_kl = use_absolute_kl
        self.lr = lr
        self.baseline_decay = 0.9
        self.register_buffer("baseline", torch.zeros(()))
        self.automatic_optimization = False

    def configure_optimizers(self):
        return torch.optim.AdamW(self.policy.parameters(), lr=self.lr)

    @staticmethod
    def _response_logprobs(model, tokens, prompt_len):
        logits = model(input_ids=tokens).logits[:, prompt_len - 1 : -1]
        return F.log_softmax(logits, dim=-1).gather(-1, tokens[:, prompt_len:].unsqueeze(-1)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        tokens, response_mask, scores = batch["tokens"], batch["response_mask"], batch["scores"]
        prompt_len = batch["prompt_len"]

        logprobs = self._response_logprobs(self.policy, tokens, prompt_len)
        with torch.no_grad():
            init_logprobs = self._response_logprobs(self.init_policy, tokens, prompt_len)
            # error: KL006
            init_policy_kl = calculate_kl_penalty(log_probs_a=init_logprobs, log_probs_b=logprobs, use_absolute_kl=self.use_absolute_kl)
            rewards = -self.kl_coef * init_policy_kl * response_mask
            last = response_mask.sum(dim=-1).long() - 1
            rewards[torch.arange(rewards.size(0)), last] += scores
            returns = discounted_returns(rewards, response_mask)

        # running-mean baseline from earlier batches: constant within this step
        pg_loss = -((returns - self.baseline) * logprobs * response_mask).sum(dim=-1).mean()

        opt.zero_grad()
        self.manual_backward(pg_loss)
        self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        opt.step()
        self.baseline.mul_(self.baseline_decay).add_((1 - self.baseline_decay) * returns[:, 0].mean())

        self.log("train/pg_loss", pg_loss.detach(), prog_bar=True)
        self.log("train/init_policy_kl", (init_policy_kl * response_mask).sum(dim=-1).mean())
        return pg_loss
