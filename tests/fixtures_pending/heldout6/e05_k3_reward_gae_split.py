"""PPO with a critic: k3 (written with expm1) placed in per-token rewards in one function, GAE returns in another."""
import torch


@torch.no_grad()
def compute_token_rewards(scores, logprobs, ref_logprobs, response_mask, kl_coef):
    delta = ref_logprobs - logprobs
    # error: KL004
    kl = torch.expm1(delta) - delta
    rewards = -kl_coef * kl * response_mask
    last_idx = response_mask.sum(dim=1).long() - 1
    rewards[torch.arange(rewards.size(0), device=rewards.device), last_idx] += scores
    return rewards, kl


@torch.no_grad()
def compute_gae(rewards, values, response_mask, gamma=1.0, lam=1.0):
    values = values * response_mask
    lastgaelam = torch.zeros_like(rewards[:, 0])
    advantages_reversed = []
    gen_len = rewards.size(1)
    for t in reversed(range(gen_len)):
        next_values = values[:, t + 1] if t < gen_len - 1 else torch.zeros_like(lastgaelam)
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages * response_mask, (advantages + values) * response_mask


def ppo_losses(logprobs, old_logprobs, values, returns, advantages, mask, clip=0.2):
    ratio = torch.exp(logprobs - old_logprobs)
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip))
    pg_loss = (pg * mask).sum() / mask.sum()
    vf_loss = 0.5 * (((values - returns) ** 2) * mask).sum() / mask.sum()
    return pg_loss, vf_loss


def ppo_step(policy, critic, optimizer, rollout, kl_coef=0.05, vf_coef=0.1):
    rewards, kl = compute_token_rewards(
        rollout["scores"], rollout["old_logprobs"], rollout["ref_logprobs"], rollout["mask"], kl_coef
    )
    advantages, returns = compute_gae(rewards, rollout["old_values"], rollout["mask"])
    logits = policy(rollout["input_ids"]).logits[:, -rollout["mask"].size(1) - 1 : -1]
    logprobs = torch.log_softmax(logits, -1).gather(-1, rollout["responses"].unsqueeze(-1)).squeeze(-1)
    values = critic(rollout["input_ids"])[:, -rollout["mask"].size(1) :]
    pg_loss, vf_loss = ppo_losses(logprobs, rollout["old_logprobs"], values, returns, advantages, rollout["mask"])
    loss = pg_loss + vf_coef * vf_loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"pg_loss": pg_loss.item(), "kl": (kl * rollout["mask"]).sum(1).mean().item()}
