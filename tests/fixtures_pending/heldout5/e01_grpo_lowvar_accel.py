"""GRPO actor update with a config-selected KL loss estimator (verl-like)."""
import torch
import torch.nn.functional as F


def token_logprobs(logits, labels):
    logp = F.log_softmax(logits.float(), dim=-1)
    return torch.gather(logp, -1, labels.unsqueeze(-1)).squeeze(-1)


def kl_penalty(logprob, ref_logprob, kind="kl"):
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kind in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).clamp(min=-10, max=10)
        return kld
    raise NotImplementedError(kind)


class GRPOActor:
    def __init__(self, model, ref_model, accelerator, optimizer, kl_coef=0.001, kl_loss_type="low_var_kl", clip_eps=0.2):
        self.model = model
        self.ref_model = ref_model
        self.accelerator = accelerator
        self.optimizer = optimizer
        self.kl_coef = kl_coef
        self.kl_loss_type = kl_loss_type
        self.clip_eps = clip_eps

    def compute_loss(self, batch):
        n = batch["responses"].size(1)
        logits = self.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, -n - 1 : -1]
        log_prob = token_logprobs(logits, batch["responses"])
        with torch.no_grad():
            ref_logits = self.ref_model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, -n - 1 : -1]
            ref_log_prob = token_logprobs(ref_logits, batch["responses"])
        mask = batch["response_mask"]
        ratio = torch.exp(log_prob - batch["old_log_probs"])
        adv = batch["advantages"].unsqueeze(-1)
        pg = -torch.min(ratio * adv, ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * adv)
        pg_loss = (pg * mask).sum() / mask.sum()
        # error: KL002
        kld = kl_penalty(log_prob, ref_log_prob, kind=self.kl_loss_type)
        kl_loss = (kld * mask).sum() / mask.sum()
        return pg_loss + self.kl_coef * kl_loss

    def step(self, batch):
        loss = self.compute_loss(batch)
        self.accelerator.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.detach()
