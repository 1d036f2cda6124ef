import torch


def reward_to_go(rewards: torch.Tensor, loss_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted reward-to-go along the time axis; padded positions contribute nothing."""
    rewards = rewards * loss_mask
    if gamma == 1.0:
        return rewards.flip(-1).cumsum(-1).flip(-1) * loss_mask
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.size(1) - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        out[:, t] = running
    return out * loss_mask
