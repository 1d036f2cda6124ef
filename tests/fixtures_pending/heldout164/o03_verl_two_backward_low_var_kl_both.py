# Reviewer: verl-style two-pass actor, same skeleton as e03, configured with
# both halves of the k3 KL on and the same coefficient: use_kl_in_reward puts
# -kl_coef * k3 (no_grad, from the on-policy old log-probs) into the token
# rewards, credited by reverse-cumsum returns in the policy-gradient pass, and
# use_kl_loss adds kl_coef * k3 with gradient in the second backward pass.
# Alone, the reward half gives grad KL(pi||pi_ref) minus the token-level
# partial of grad KL(pi_ref||pi) and the loss half gives that partial; the two
# backward passes add up in p.grad to grad KL(pi||pi_ref) of the sequence.
# Verdict: correct ("both", as the rule book describes it).
from dataclasses import dataclass

import torch

from verl import DataProto  # noqa: F401  (not used on this path)
from verl.utils.torch_functional import logprobs_from_logits  # noqa: F401


def kl_penalty(logprob, ref_logprob, kl_penalty: str):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty == "low_var_kl":
        kl = ref_logprob - logprob
        ratio = torch.exp(kl)
        return ratio - kl - 1
    raise NotImplementedError(kl_penalty)


@dataclass
class AlgoConfig:
    use_kl_in_reward: bool = True
    use_kl_loss: bool = True
    kl_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    clip_ratio: float = 0.2
    micro_batch_size: int = 4
    loss_scale_len: int = 8
    grad_clip: float = 1.0


def compute_reinforce_returns(token_level_rewards, response_mask):
    with torch.no_grad():
        return (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)


class TwoPassActor:
    def __init__(self, config: AlgoConfig, actor_module, actor_optimizer):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def _forward(self, mb):
        logits = self.actor_module(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
        logits = logits[:, -mb["responses"].shape[-1] - 1 : -1]
        return torch.log_softmax(logits, -1).gather(-1, mb["responses"].unsqueeze(-1)).squeeze(-1)

    def update_policy(self, batch):
        cfg = self.config
        mask = batch["response_mask"]
        rewards = batch["token_level_scores"]
        if cfg.use_kl_in_reward:
            with torch.no_grad():
                # ok: KL004
                kld = kl_penalty(batch["old_log_probs"], batch["ref_log_prob"], kl_penalty=cfg.kl_loss_type)
            rewards = rewards - cfg.kl_coef * kld * mask
        batch["advantages"] = compute_reinforce_returns(rewards, mask)

        bsz = mask.shape[0]
        n_micro = max(1, (bsz + cfg.micro_batch_size - 1) // cfg.micro_batch_size)
        self.actor_optimizer.zero_grad()
        for i in range(0, bsz, cfg.micro_batch_size):
            mb = {k: v[i : i + cfg.micro_batch_size] for k, v in batch.items()}
            m = mb["response_mask"]
            log_prob = self._forward(mb)
            ratio = torch.exp(log_prob - mb["old_log_probs"])
            clipped = torch.clamp(ratio, 1 - cfg.clip_ratio, 1 + cfg.clip_ratio)
            pg = torch.maximum(-mb["advantages"] * ratio, -mb["advantages"] * clipped)
            pg_loss = (pg * m).sum(-1).mean() / cfg.loss_scale_len
            (pg_loss / n_micro).backward(retain_graph=cfg.use_kl_loss)
            if cfg.use_kl_loss:
                # ok: KL002
                kld = kl_penalty(log_prob, mb["ref_log_prob"], kl_penalty=cfg.kl_loss_type)
                kl_loss = (kld * m).sum(-1).mean() / cfg.loss_scale_len
                (cfg.kl_coef * kl_loss / n_micro).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.actor_module.parameters(), cfg.grad_clip)
        self.actor_optimizer.step()
        return {"actor/grad_norm": float(grad_norm)}
