# Reviewer: the actor update: a clipped policy gradient on the stored advantages
# (the returns of the token-level rewards, KL included).
"""Actor update on a batch prepared by the driver."""

import torch

from verl import DataProto

from .core_algos import compute_policy_loss


def update_policy(actor_module, optimizer, data: DataProto, clip_ratio: float = 0.2):
    batch = data.batch
    responses = batch["responses"]
    logits = actor_module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, -responses.size(1) - 1 : -1].float()
    log_prob = torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    loss = compute_policy_loss(batch["old_log_probs"], log_prob, batch["advantages"], batch["response_mask"], cliprange=clip_ratio)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(actor_module.parameters(), 1.0)
    optimizer.step()
    return {"actor/pg_loss": loss.detach().item()}
