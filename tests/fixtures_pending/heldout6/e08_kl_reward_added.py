"""OpenRLHF-style compute_reward: k1 KL term combined with the terminal score with a + sign; returns by reverse cumsum."""
import torch


@torch.no_grad()
def compute_reward(r, kl_coef, log_probs, ref_log_probs, action_mask):
    kl = (log_probs - ref_log_probs) * action_mask
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    # error: KL006
    reward = last_reward + kl_coef * kl
    return reward


@torch.no_grad()
def get_cumulative_returns(rewards, action_mask, gamma=1.0):
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * action_mask


def policy_loss_fn(log_probs, returns, action_mask):
    return -(returns * log_probs * action_mask).sum(-1).mean()


def train_batch(actor, experience, optimizer, kl_coef=0.01):
    log_probs = actor(experience["sequences"], experience["action_mask"])
    reward = compute_reward(
        experience["rewards"], kl_coef, log_probs.detach(), experience["ref_log_probs"], experience["action_mask"]
    )
    returns = get_cumulative_returns(reward, experience["action_mask"])
    loss = policy_loss_fn(log_probs, returns, experience["action_mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
