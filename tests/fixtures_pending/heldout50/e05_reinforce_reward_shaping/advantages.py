# Reviewer: advantage estimation for the REINFORCE package: discounted
# returns (reward-to-go, gamma = 1 by default) minus a running scalar baseline
# that does not depend on the current samples.
import torch


def compute_returns(rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * response_mask


class RunningBaseline:
    """Exponential moving average of the mean return, updated after each step."""

    def __init__(self, momentum: float = 0.9):
        self.momentum = momentum
        self.value = 0.0
        self.initialised = False

    def __call__(self, returns: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        return (returns - self.value) * response_mask

    @torch.no_grad()
    def update(self, returns: torch.Tensor, response_mask: torch.Tensor) -> None:
        mean_return = ((returns * response_mask).sum() / response_mask.sum().clamp(min=1)).item()
        if not self.initialised:
            self.value, self.initialised = mean_return, True
        else:
            self.value = self.momentum * self.value + (1 - self.momentum) * mean_return
