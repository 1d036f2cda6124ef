# Reviewer: a PPO-without-critic (REINFORCE with returns) trainer in the style
# of ROLL / SkyRL, with the policy as a pure function of its parameters.
# `shape_rewards` turns scores and the rollout's log-ratio to the reference into
# per-token rewards and returns (a reverse cumulative sum, gamma = 1); the
# per-sample pg loss is mapped with `vmap` and differentiated with
# `torch.func.grad`. The KL enters the rewards with a plus sign:
# `token_scores + kl_coef * (old_logp - ref_logp)`.
# Verdict: BUG (KL006). A KL *added* to the rewards is a bonus: the loss's
# expected KL gradient is -kl_coef * grad KL(pi||pi_ref), so descent increases
# the KL.
import torch
from torch.func import functional_call, grad, vmap


@torch.no_grad()
def shape_rewards(batch, kl_coef):
    mask = batch["response_mask"]
    old_logp, ref_logp = batch["old_log_probs"], batch["ref_log_probs"]
    token_scores = torch.zeros_like(old_logp)
    last = mask.sum(-1).long() - 1
    token_scores[torch.arange(mask.shape[0]), last] = batch["scores"]
    # error: KL006
    token_rewards = token_scores + kl_coef * (old_logp - ref_logp)
    token_rewards = token_rewards * mask
    returns = torch.flip(torch.cumsum(torch.flip(token_rewards, dims=[-1]), dim=-1), dims=[-1])
    return returns


def make_sample_loss(model):
    def sample_loss(params, input_ids, mask, returns):
        T = mask.shape[-1]
        logits = functional_call(model, params, (input_ids.unsqueeze(0),)).logits.squeeze(0)
        logp = torch.gather(logits[-T - 1 : -1].log_softmax(-1), -1, input_ids[-T:].unsqueeze(-1)).squeeze(-1)
        return -(returns * logp * mask).sum()

    return sample_loss


def policy_update(model, params, batch, kl_coef=0.02, lr=1e-6):
    returns = shape_rewards(batch, kl_coef)
    sample_loss = make_sample_loss(model)

    def batch_loss(p):
        losses = vmap(sample_loss, in_dims=(None, 0, 0, 0))(p, batch["input_ids"], batch["response_mask"], returns)
        return losses.mean()

    grads = grad(batch_loss)(params)
    new_params = {k: v - lr * grads[k] for k, v in params.items()}
    return new_params, {"return": returns[:, 0].mean().item()}
