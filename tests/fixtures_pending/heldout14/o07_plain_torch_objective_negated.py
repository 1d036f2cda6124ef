"""A hand-written policy-gradient loop that maximises a KL-regularised objective.

    J(pi) = E[A * log pi(y)] - beta * KL(pi || pi_ref)

The KL term keeps the value of the k3 estimate (what the dashboards have
always shown) and carries the gradient of the sequence KL through the
reward-to-go of the log-ratio. The optimiser minimises ``-J``.
"""

import torch
import torch.nn.functional as F


def response_logprobs(model, input_ids, response_ids):
    prompt_len = input_ids.shape[1] - response_ids.shape[1]
    logits = model(input_ids).logits[:, prompt_len - 1 : -1]
    return F.log_softmax(logits, dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)


def train_iteration(policy, ref_policy, optimizer, batch, beta=0.05, max_grad_norm=1.0):
    input_ids = batch["input_ids"]
    response_ids = batch["response_ids"]
    response_mask = batch["response_mask"].to(torch.float32)
    advantages = batch["advantages"]

    logp = response_logprobs(policy, input_ids, response_ids)
    with torch.no_grad():
        ref_logp = response_logprobs(ref_policy, input_ids, response_ids)

    log_ratio = (logp - ref_logp).detach() * response_mask
    # ok: KL005
    k3_value = (torch.exp(-log_ratio) + log_ratio - 1) * response_mask
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    # ok: KL006
    kl_term = k3_value + kl_to_go * (logp - logp.detach())

    reward_term = (advantages.unsqueeze(-1) * logp * response_mask).sum(-1)
    kl_penalty = (kl_term * response_mask).sum(-1)
    objective = (reward_term - beta * kl_penalty).mean()
    loss = -objective

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    optimizer.step()
    return {"objective": objective.item(), "kl": kl_penalty.mean().item()}


def train(policy, ref_policy, dataloader, lr=1e-6, beta=0.05, epochs=1):
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    for _ in range(epochs):
        for batch in dataloader:
            stats = train_iteration(policy, ref_policy, optimizer, batch, beta=beta)
            print(stats)
