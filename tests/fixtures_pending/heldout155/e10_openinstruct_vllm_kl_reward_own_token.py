# Reviewer: open-instruct-style GRPO with vLLM actors. The generation actor
# returns engine log-probs; the packer fetches reference log-probs and stores a
# per-token KL reward -beta * (lp - ref) in a padded numpy array. The learner
# builds Dr.GRPO advantages (score minus group mean) and adds the KL reward of
# each token to that token's advantage only: no token is credited with the KL
# of the tokens after it. Partial gradient of the sequence KL(pi||pi_ref).
# Verdict: bug, KL003, reported where the packer computes the KL reward.
from dataclasses import dataclass

import numpy as np
import torch

from open_instruct.vllm_utils import create_vllm_engines
from open_instruct.rl_utils import PackedSequences


@dataclass
class Args:
    beta: float = 0.05
    num_samples_per_prompt_rollout: int = 1
    clip_lower: float = 0.2
    clip_higher: float = 0.28


class GenerationPacker:
    def __init__(self, args: Args, ref_policy=None):
        self.args, self.ref_policy = args, ref_policy

    def pack(self, responses, engine_logprobs, scores):
        T = max(len(r) for r in responses)
        B = len(responses)
        lp = np.zeros((B, T))
        kl_reward = np.zeros((B, T))
        mask = np.zeros((B, T))
        for i, (resp, elp) in enumerate(zip(responses, engine_logprobs)):
            n = len(resp)
            ref = np.asarray(self.ref_policy.logprobs(resp), dtype=np.float64)
            lp[i, :n] = elp
            # error: KL003
            kl_reward[i, :n] = -self.args.beta * (np.asarray(elp) - ref)
            mask[i, :n] = 1.0
        return {"old_logprobs": lp, "kl_reward": kl_reward, "mask": mask, "scores": np.asarray(scores, dtype=np.float64)}


class PolicyTrainerRayProcess:
    def __init__(self, args: Args, model=None, optimizer=None):
        self.args, self.model, self.optimizer = args, model, optimizer

    def advantages(self, data):
        g = self.args.num_samples_per_prompt_rollout
        scores = torch.from_numpy(data["scores"]).view(-1, g)
        seq_adv = (scores - scores.mean(-1, keepdim=True)).view(-1, 1)
        kl_reward = torch.from_numpy(data["kl_reward"])
        return seq_adv + kl_reward

    def loss(self, new_logprobs, data):
        mask = torch.from_numpy(data["mask"])
        adv = self.advantages(data)
        ratio = torch.exp(new_logprobs - torch.from_numpy(data["old_logprobs"]))
        clipped = ratio.clamp(1 - self.args.clip_lower, 1 + self.args.clip_higher)
        pg = -torch.min(ratio * adv, clipped * adv)
        return (pg * mask).sum(-1).mean()

    def train(self, data, query_responses):
        new_logprobs = self.model.forward_logprobs(query_responses)
        loss = self.loss(new_logprobs, data)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
