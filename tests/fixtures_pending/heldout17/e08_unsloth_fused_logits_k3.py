"""Unsloth-style fused GRPO loss that works on logits.

``grpo_compute_loss`` receives the policy's, the behaviour policy's and the
reference model's logits for the completion and forms the per-token log-probs
itself (gather minus logsumexp), so that a chunked trainer can call it on
slices of the hidden states without materialising full log-prob tensors.
"""

from typing import Dict, Tuple

import torch


def grpo_compute_loss(
    ref_logits: torch.Tensor,
    new_logits: torch.Tensor,
    old_logits: torch.Tensor,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    advantages: torch.Tensor,
    temperature: float = 1.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    new_logits = new_logits.to(torch.float32) / temperature
    ref_logits = ref_logits.to(torch.float32) / temperature
    old_logits = old_logits.to(torch.float32) / temperature
    input_ids = input_ids.unsqueeze(-1)

    new_x = torch.gather(new_logits, dim=-1, index=input_ids).squeeze(-1)
    new = new_x - torch.logsumexp(new_logits, dim=-1)
    with torch.no_grad():
        ref_x = torch.gather(ref_logits, dim=-1, index=input_ids).squeeze(-1)
        ref = ref_x - torch.logsumexp(ref_logits, dim=-1)
        old_x = torch.gather(old_logits, dim=-1, index=input_ids).squeeze(-1)
        old = old_x - torch.logsumexp(old_logits, dim=-1)

    if beta != 0.0:
        # error: KL002
        kl_i = torch.exp(ref - new) - (ref - new) - 1.0
    else:
        kl_i = torch.zeros_like(new)

    coef_1 = torch.exp(new - old)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    loss_1 = coef_1 * advantages.unsqueeze(1)
    loss_2 = coef_2 * advantages.unsqueeze(1)
    loss_i = -torch.min(loss_1, loss_2)
    if beta != 0.0:
        loss_i = loss_i + beta * kl_i

    mask = mask.to(torch.float32)
    n_mask_per_reward = mask.sum(1)
    loss = (loss_i * mask).sum() / mask.sum()

    with torch.no_grad():
        completion_length = n_mask_per_reward.mean()
        mean_kl = ((kl_i * mask).sum(1) / n_mask_per_reward).mean()
    return loss, completion_length, mean_kl


class UnslothGRPOTrainer:
    def __init__(self, model, ref_model, accelerator, beta: float = 0.04, num_chunks: int = 4, temperature: float = 1.0):
        self.model = model
        self.ref_model = ref_model
        self.accelerator = accelerator
        self.beta = beta
        self.num_chunks = num_chunks
        self.temperature = temperature
        self._metrics: Dict[str, list] = {"kl": [], "completion_length": []}

    def compute_loss(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        input_ids = inputs["prompt_completion_ids"]
        completion_ids = inputs["completion_ids"]
        completion_mask = inputs["completion_mask"]
        logits_to_keep = completion_ids.size(1)
        new_logits = self.model(input_ids).logits[:, -logits_to_keep - 1 : -1]
        with torch.no_grad():
            ref_logits = self.ref_model(input_ids).logits[:, -logits_to_keep - 1 : -1]
        old_logits = inputs.get("old_logits", new_logits.detach())
        total = 0.0
        for new_c, ref_c, old_c, ids_c, mask_c, adv_c in zip(
            new_logits.chunk(self.num_chunks),
            ref_logits.chunk(self.num_chunks),
            old_logits.chunk(self.num_chunks),
            completion_ids.chunk(self.num_chunks),
            completion_mask.chunk(self.num_chunks),
            inputs["advantages"].chunk(self.num_chunks),
        ):
            loss, completion_length, mean_kl = grpo_compute_loss(
                ref_c, new_c, old_c, ids_c, mask_c, self.beta, adv_c, temperature=self.temperature
            )
            total = total + loss / self.num_chunks
            self._metrics["kl"].append(mean_kl.item())
            self._metrics["completion_length"].append(completion_length.item())
        return total

    def training_step(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        loss = self.compute_loss(inputs)
        self.accelerator.backward(loss)
        return loss.detach()
