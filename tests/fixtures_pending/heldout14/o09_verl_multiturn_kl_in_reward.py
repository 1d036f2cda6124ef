"""verl-style multi-turn agent RL with the KL penalty in the token-level rewards.

A response interleaves assistant turns with tool observations. ``response_mask``
is the turn mask: 1 on tokens the policy generated, 0 on tool output, which
was not sampled from the policy and carries neither a KL term nor a gradient.
Returns run across the tool tokens, so an early assistant token is credited
with the KL of every later assistant turn.
"""

import torch
from verl import DataProto


class FixedKLController:
    def __init__(self, kl_coef):
        self.value = kl_coef

    def update(self, current_kl, n_steps):
        pass


def kl_penalty(logprob, ref_logprob, kl_penalty="kl"):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        return torch.exp(kl) - kl - 1
    raise NotImplementedError(kl_penalty)


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum().clamp(min=1)


@torch.no_grad()
def apply_kl_penalty(data: DataProto, kl_ctrl: FixedKLController, kl_penalty_type="kl"):
    response_mask = data.batch["response_mask"]
    token_level_scores = data.batch["token_level_scores"]
    # rollout log-probs: exactly what a reward should be computed from
    # ok: KL005
    kld = kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty_type)
    kld = kld * response_mask
    token_level_rewards = token_level_scores - kl_ctrl.value * kld

    current_kl = (masked_mean(kld, response_mask)).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=response_mask.shape[0])
    data.batch["token_level_rewards"] = token_level_rewards
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": kl_ctrl.value}


@torch.no_grad()
def compute_multiturn_returns(token_level_rewards, response_mask):
    """Undiscounted reward-to-go over the whole trajectory; tool tokens pass returns through."""
    rewards = token_level_rewards * response_mask
    returns = rewards.flip(-1).cumsum(-1).flip(-1)
    return returns * response_mask, returns * response_mask


def update_actor(actor_module, optimizer, data: DataProto, clip_ratio=0.2):
    responses = data.batch["responses"]
    response_mask = data.batch["response_mask"]
    response_length = responses.size(1)
    logits = actor_module(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"]).logits
    logits = logits[:, -response_length - 1 : -1]
    log_prob = torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)

    old_log_prob = data.batch["old_log_probs"]
    advantages = data.batch["advantages"]
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio))
    pg_loss = masked_mean(pg_losses, response_mask)

    optimizer.zero_grad()
    pg_loss.backward()
    optimizer.step()
    return {"actor/pg_loss": pg_loss.item()}


def fit_step(actor_module, optimizer, data: DataProto, kl_ctrl: FixedKLController):
    data, metrics = apply_kl_penalty(data, kl_ctrl, kl_penalty_type="kl")
    advantages, returns = compute_multiturn_returns(data.batch["token_level_rewards"], data.batch["response_mask"])
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    metrics.update(update_actor(actor_module, optimizer, data))
    return metrics
