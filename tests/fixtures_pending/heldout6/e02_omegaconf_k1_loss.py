"""verl-style actor update whose KL loss type is read from an OmegaConf tree (`config.actor.kl_loss_type`)."""
import torch
from omegaconf import OmegaConf

DEFAULTS = OmegaConf.create(
    {
        "actor": {"use_kl_loss": True, "kl_loss_coef": 0.001, "kl_loss_type": "kl", "clip_ratio": 0.2},
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    }
)


def kl_penalty(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = (ref_logprob - logprob).clamp(-20, 20)
        return (kl.exp() - kl - 1).clamp(-10, 10)
    raise NotImplementedError(kl_penalty)


def agg_loss(loss_mat, loss_mask):
    return (loss_mat * loss_mask).sum() / loss_mask.sum().clamp(min=1)


class DataParallelPPOActor:
    def __init__(self, module, optimizer, config=DEFAULTS.actor):
        self.actor_module = module
        self.actor_optimizer = optimizer
        self.config = config

    def _log_prob(self, input_ids, responses):
        logits = self.actor_module(input_ids).logits[:, -responses.size(1) - 1 : -1]
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)

    def update_policy(self, data):
        metrics = {}
        log_prob = self._log_prob(data["input_ids"], data["responses"])
        response_mask = data["response_mask"]
        ratio = torch.exp(log_prob - data["old_log_probs"])
        clip = self.config.clip_ratio
        pg_losses = torch.max(-data["advantages"] * ratio, -data["advantages"] * ratio.clamp(1 - clip, 1 + clip))
        policy_loss = agg_loss(pg_losses, response_mask)
        if self.config.use_kl_loss:
            # error: KL001
            kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty=self.config.kl_loss_type)
            kl_loss = agg_loss(kld, response_mask)
            policy_loss = policy_loss + kl_loss * self.config.kl_loss_coef
            metrics["actor/kl_loss"] = kl_loss.detach().item()
        self.actor_optimizer.zero_grad()
        policy_loss.backward()
        self.actor_optimizer.step()
        metrics["actor/pg_loss"] = policy_loss.detach().item()
        return metrics
