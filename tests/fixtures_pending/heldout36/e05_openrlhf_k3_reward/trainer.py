import torch


def reinforce_step(actor, optimizer, experience):
    """REINFORCE on the KL-shaped returns (gamma = 1 is the reward-to-go)."""
    action_log_probs = actor(experience["sequences"], experience["num_actions"], experience["attention_mask"])
    mask = experience["action_mask"]
    loss = -(experience["returns"] * action_log_probs * mask).sum(-1).mean()
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
    optimizer.step()
    return loss.item()
