# Reviewer: ROLL-style REINFORCE pipeline with the KL in the token rewards. The
# rollout log-probs come from vLLM with logprobs_mode="processed_logprobs",
# i.e. after the temperature logit processor (top_p = 1, top_k = -1: no
# truncation), so on-policy they equal the tempered policy's log-probs,
# detached. The reference is recomputed on the same temperature. The per-token
# reward -kl_coef * (logp_rollout - logp_ref) is computed under no_grad (a
# detached KL reward is fine), but the advantage of each token is its OWN
# reward plus the sequence score: no reward-to-go. The policy gradient then
# credits each token with its own KL only: the token-level (partial) gradient
# of the sequence KL(pi||pi_ref).
# Verdict: bug, KL003, reported where the KL reward is computed.
from dataclasses import dataclass

import torch

from roll.pipeline.rlvr.rlvr_config import RLVRConfig
from vllm import SamplingParams


@dataclass
class PipelineArgs:
    temperature: float = 0.8
    top_p: float = 1.0
    top_k: int = -1
    kl_coef: float = 0.05
    pg_clip: float = 0.2


def sampling_params(args: PipelineArgs) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, logprobs=0)


@torch.no_grad()
def compute_token_reward(data, args: PipelineArgs):
    response_mask = data["response_mask"]
    rollout_log_probs = data["rollout_log_probs"]  # vLLM, processed (tempered)
    ref_log_probs = data["ref_log_probs"]  # reference, same temperature
    # error: KL003
    token_level_rewards = -args.kl_coef * (rollout_log_probs - ref_log_probs) * response_mask
    last = response_mask.sum(dim=-1).long() - 1
    rows = torch.arange(response_mask.size(0))
    token_level_rewards[rows, last] += data["scores"]
    data["token_level_rewards"] = token_level_rewards
    return data


@torch.no_grad()
def compute_advantage(data):
    response_mask = data["response_mask"]
    scores = data["scores"]
    # per-token REINFORCE: each token sees its own shaped reward plus the score
    score_adv = (scores - scores.mean()) if scores.numel() > 1 else torch.zeros_like(scores)
    kl_part = data["token_level_rewards"].clone()
    last = response_mask.sum(dim=-1).long() - 1
    kl_part[torch.arange(kl_part.size(0)), last] -= scores
    data["advantages"] = (kl_part + score_adv.unsqueeze(-1)) * response_mask
    return data


def actor_loss(log_probs, data, args: PipelineArgs):
    old_log_probs = data["rollout_log_probs"]
    advantages = data["advantages"]
    mask = data["response_mask"]
    ratio = torch.exp(log_probs - old_log_probs)
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - args.pg_clip, 1 + args.pg_clip) * advantages
    pg_loss = -(torch.min(surr1, surr2) * mask).sum(dim=-1).mean()
    return pg_loss


def train_step(data, log_probs, args: PipelineArgs = PipelineArgs()):
    data = compute_token_reward(data, args)
    data = compute_advantage(data)
    return actor_loss(log_probs, data, args)
