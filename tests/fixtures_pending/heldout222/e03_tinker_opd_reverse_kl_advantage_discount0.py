# Reviewer: on-policy distillation in the style of the tinker-cookbook recipe. The
# student samples; the teacher scores the sampled tokens; the per-token reverse KL
# log pi_student(y_t) - log pi_teacher(y_t) (sampler log-probs, detached) is
# subtracted from the advantages by incorporate_kl_penalty. With the default
# kl_discount_factor = 0.0 each token is credited with its OWN log-ratio only (no
# reward-to-go), and the importance-sampling loss weights log pi_t by it. The
# expected gradient is the token-level partial E[sum_t x_t grad log pi_t], not
# grad KL(student||teacher) of the sequence: a token is not charged for the
# teacher-student disagreement it steers the rest of the sequence into.
# Verdict: bug, KL003, reported inside incorporate_kl_penalty on the line that
# computes the per-token reverse KL.
from dataclasses import dataclass

import torch

import tinker
from tinker_cookbook.rl.types import TrajectoryGroup


@dataclass
class OnPolicyDistillConfig:
    teacher_model: str = "Qwen/Qwen3-32B"
    kl_penalty_coef: float = 1.0
    kl_discount_factor: float = 0.0
    loss_fn: str = "importance_sampling"
    groups_per_batch: int = 64
    group_size: int = 4
    learning_rate: float = 1e-4


def discounted_future_sum(x, mask, gamma):
    """G_t = sum_{s>=t} gamma^(s-t) x_s over the masked time axis."""
    out = torch.zeros_like(x)
    running = torch.zeros_like(x[:, 0])
    for t in reversed(range(x.shape[1])):
        running = x[:, t] * mask[:, t] + gamma * running * mask[:, t]
        out[:, t] = running
    return out


def incorporate_kl_penalty(data, teacher_logprobs, cfg: OnPolicyDistillConfig):
    """Subtract the (discounted) reverse KL to the teacher from the advantages in place."""
    mask = data["mask"]
    sampled_logprobs = data["logprobs"]
    # error: KL003
    reverse_kl = (sampled_logprobs - teacher_logprobs) * mask
    if cfg.kl_discount_factor > 0:
        reverse_kl = discounted_future_sum(reverse_kl, mask, cfg.kl_discount_factor)
    data["advantages"] = data["advantages"] - cfg.kl_penalty_coef * reverse_kl * mask
    n_tokens = mask.sum().clamp(min=1)
    return {"teacher_kl": ((sampled_logprobs - teacher_logprobs) * mask).sum().item() / n_tokens.item()}


def importance_sampling_loss(target_logprobs, data):
    """The 'importance_sampling' loss: -sum_t (pi / q_sampler) * A_t."""
    ratio = torch.exp(target_logprobs - data["logprobs"])
    return -(ratio * data["advantages"] * data["mask"]).sum(-1).mean()


class OnPolicyDistiller:
    def __init__(self, cfg: OnPolicyDistillConfig = None, service_client=None):
        self.cfg = cfg or OnPolicyDistillConfig()
        self.service_client = service_client
        self.teacher_client = None
        self.training_client = None

    def setup(self):
        self.teacher_client = self.service_client.create_sampling_client(base_model=self.cfg.teacher_model)
        self.training_client = self.service_client.create_lora_training_client(base_model="Qwen/Qwen3-8B")

    def teacher_logprobs(self, data):
        with torch.no_grad():
            full = self.teacher_client.compute_logprobs(data["tokens"])
        return torch.as_tensor(full)[:, -data["mask"].shape[1] :]

    def assemble(self, groups: list):
        tokens = torch.cat([g["tokens"] for g in groups])
        logprobs = torch.cat([g["logprobs"] for g in groups])
        mask = torch.cat([g["mask"] for g in groups]).float()
        # distillation only: no task reward, advantages start at zero
        return {"tokens": tokens, "logprobs": logprobs, "mask": mask, "advantages": torch.zeros_like(logprobs)}

    def train_step(self, groups):
        data = self.assemble(groups)
        metrics = incorporate_kl_penalty(data, self.teacher_logprobs(data), self.cfg)
        target_logprobs = self.training_client.forward(data["tokens"])[:, -data["mask"].shape[1] :]
        loss = importance_sampling_loss(target_logprobs, data)
        loss.backward()
        metrics["loss"] = loss.item()
        return metrics
