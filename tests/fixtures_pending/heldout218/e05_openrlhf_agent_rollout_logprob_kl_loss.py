# Reviewer: OpenRLHF agent mode (AgentExecutor driving a multi-step environment through
# agent_func.step). Action ranges of the assistant turns give action_mask; environment
# feedback tokens are masked out. With the default AgentPPOArgs (use_kl_loss=True,
# kl_estimator="k3") the KL is kept out of the rewards and added to the actor loss, but
# the loss computes it from experience.action_log_probs (the log-probs stored at rollout
# time, under no_grad) and experience.base_action_log_probs: no policy log-prob with a
# gradient enters it. The KL term is a constant for autograd; the regulariser does nothing.
# Verdict: bug, KL005, reported on the `kl = compute_approx_kl(...)` call in compute_actor_loss.
# The k3 computed in process_experience is only logged (no KL in the reward when use_kl_loss).
from dataclasses import dataclass, field
from typing import Optional

import torch

from openrlhf.models.actor import Actor
from openrlhf.utils.deepspeed import DeepspeedStrategy


@dataclass
class AgentPPOArgs:
    use_kl_loss: bool = True
    kl_estimator: str = "k3"
    init_kl_coef: float = 0.001
    gamma: float = 1.0
    eps_clip: float = 0.2
    generate_max_len: int = 4096
    max_agent_steps: int = 8


@dataclass
class Experience:
    sequences: torch.Tensor
    action_log_probs: torch.Tensor
    base_action_log_probs: torch.Tensor
    action_mask: torch.Tensor
    attention_mask: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    info: dict = field(default_factory=dict)


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    if kl_estimator == "k1":
        log_ratio = log_probs.float() - log_probs_base.float()
    elif kl_estimator == "k2":
        log_ratio = (log_probs.float() - log_probs_base.float()) ** 2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = -(log_probs.float() - log_probs_base.float())
        log_ratio = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(kl_estimator)
    return log_ratio.clamp(min=-10, max=10)


def masked_mean(tensor, mask, dim=None):
    if dim is None:
        return (tensor * mask).sum() / mask.sum().clamp(min=1)
    return (tensor * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def build_action_mask(action_ranges, num_actions):
    """action_ranges: per sample, (start, end) of each assistant turn inside the response."""
    mask = torch.zeros(len(action_ranges), num_actions)
    for i, ranges in enumerate(action_ranges):
        for start, end in ranges:
            mask[i, start:end] = 1.0
    return mask


def get_cumulative_returns(rewards, action_mask, gamma):
    returns = torch.zeros_like(rewards)
    cumulative = torch.zeros(rewards.size(0), dtype=rewards.dtype)
    for t in reversed(range(rewards.size(1))):
        cumulative = rewards[:, t] + gamma * cumulative
        returns[:, t] = cumulative
    return returns * action_mask


class PolicyLoss(torch.nn.Module):
    def __init__(self, clip_eps: float = 0.2, normalizer: int = 4096):
        super().__init__()
        self.clip_eps, self.normalizer = clip_eps, normalizer

    def forward(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        loss = -torch.min(surr1, surr2)
        return ((loss * action_mask).sum(-1) / self.normalizer).mean()


async def run_agent_episode(llm, tokenizer, agent_func, prompt, label, sampling_params, max_steps):
    """Generate a turn, let the environment answer, repeat; record each turn's action range."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    response_ids, action_ranges, observation, reward = [], [], prompt, 0.0
    for _ in range(max_steps):
        out = await llm.generate(prompt_ids + response_ids, sampling_params)
        action_ranges.append((len(response_ids), len(response_ids) + len(out.token_ids)))
        response_ids += out.token_ids
        step = await agent_func.step(observation, out.text, label)
        observation, reward = observation + out.text + step["environment_feedback"], step["rewards"]
        if step["done"]:
            break
        response_ids += tokenizer(step["environment_feedback"], add_special_tokens=False)["input_ids"]
    return prompt_ids, response_ids, action_ranges, reward


class AgentExperienceMaker:
    def __init__(self, args: AgentPPOArgs):
        self.args = args

    @torch.no_grad()
    def process_experience(self, experience: Experience, scores: torch.Tensor):
        mask = experience.action_mask
        # ok: KL004
        kl = compute_approx_kl(experience.action_log_probs, experience.base_action_log_probs, kl_estimator=self.args.kl_estimator)
        kl_coef = 0.0 if self.args.use_kl_loss else self.args.init_kl_coef
        rewards = -kl_coef * kl * mask
        last = (mask * torch.arange(mask.size(1))).argmax(-1)
        rewards[torch.arange(mask.size(0)), last] += scores
        experience.advantages = get_cumulative_returns(rewards, mask, self.args.gamma)
        experience.info["kl"] = masked_mean(kl, mask, dim=-1)
        return experience


class PPOAgentActorTrainer:
    def __init__(self, args: AgentPPOArgs, actor: Actor = None, strategy: DeepspeedStrategy = None, optimizer=None):
        self.args, self.actor, self.strategy, self.optimizer = args, actor, strategy, optimizer
        self.actor_loss_fn = PolicyLoss(args.eps_clip, normalizer=args.generate_max_len)

    def compute_actor_loss(self, action_log_probs, experience: Experience):
        actor_loss = self.actor_loss_fn(
            action_log_probs, experience.action_log_probs, experience.advantages, experience.action_mask
        )
        if self.args.use_kl_loss:
            # error: KL005
            kl = compute_approx_kl(experience.action_log_probs, experience.base_action_log_probs, kl_estimator=self.args.kl_estimator)
            kl_loss = masked_mean(kl, experience.action_mask)
        else:
            kl_loss = 0.0
        loss = actor_loss + kl_loss * self.args.init_kl_coef
        return loss, {"policy_loss": actor_loss.item(), "kl": float(kl_loss)}

    def training_step(self, experience: Experience):
        self.actor.train()
        action_log_probs = self.actor(
            experience.sequences, experience.action_mask.size(1), attention_mask=experience.attention_mask
        )
        loss, status = self.compute_actor_loss(action_log_probs, experience)
        self.strategy.backward(loss, self.actor, self.optimizer)
        self.strategy.optimizer_step(self.optimizer, self.actor, name="actor")
        return status
