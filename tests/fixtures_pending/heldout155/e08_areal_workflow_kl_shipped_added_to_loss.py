# Reviewer: AReaL-style async workflow. The rollout workflow computes the
# per-token log-ratio of the engine log-probs to the reference in numpy and
# ships it in the trajectory dict as "kl". The learner uses the task score as
# the only reward and then ADDS kl_ctl * (shipped kl) to its loss as a
# penalty. The shipped KL is a numpy constant: the penalty has no gradient.
# Verdict: bug, KL005, reported where the workflow computes the estimate.
import numpy as np
import torch

from areal.api.workflow_api import RolloutWorkflow
from areal.engine.sglang_remote import RemoteSGLangEngine


class RLVRKLWorkflow:
    def __init__(self, engine: RemoteSGLangEngine = None, ref_client=None, reward_fn=None):
        self.engine, self.ref_client, self.reward_fn = engine, ref_client, reward_fn

    async def arun_episode(self, data):
        resp = await self.engine.agenerate(data["prompt_ids"])
        ref_lp = np.asarray(await self.ref_client.alogprobs(data["prompt_ids"], resp.output_tokens))
        score = self.reward_fn(data, resp.output_tokens)
        return self.to_traj(np.asarray(resp.output_logprobs), ref_lp, score)

    def to_traj(self, logprobs, ref_logprobs, score):
        # error: KL005
        kl = logprobs - ref_logprobs
        return {"logprobs": logprobs, "kl": kl, "rewards": np.float64(score), "seqlen": len(logprobs)}


def concat_padded(trajs, key):
    T = max(t["seqlen"] for t in trajs)
    out = torch.zeros(len(trajs), T, dtype=torch.float64)
    for i, t in enumerate(trajs):
        out[i, : t["seqlen"]] = torch.from_numpy(np.asarray(t[key], dtype=np.float64))
    return out


class PPOActor:
    def __init__(self, engine=None, kl_ctl: float = 0.1, eps_clip: float = 0.2, max_tokens: int = 2048):
        self.engine, self.kl_ctl, self.eps_clip, self.max_tokens = engine, kl_ctl, eps_clip, max_tokens

    def prepare(self, trajs):
        old_lp = concat_padded(trajs, "logprobs")
        kl = concat_padded(trajs, "kl")
        mask = concat_padded(trajs, "seqlen_mask") if "seqlen_mask" in trajs[0] else (
            torch.arange(old_lp.shape[1])[None] < torch.tensor([t["seqlen"] for t in trajs])[:, None]
        ).double()
        scores = torch.tensor([float(t["rewards"]) for t in trajs], dtype=torch.float64)
        adv = (scores - scores.mean())[:, None].expand_as(old_lp)
        return old_lp, kl, mask, adv

    def ppo_loss(self, logprobs, trajs):
        old_lp, kl, mask, adv = self.prepare(trajs)
        ratio = torch.exp(logprobs - old_lp)
        pg = -torch.min(ratio * adv, ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip) * adv)
        per_token = pg + self.kl_ctl * kl
        return (per_token * mask).sum() / self.max_tokens

    def ppo_update(self, trajs, input_ids):
        logprobs = self.engine.forward(input_ids)
        loss = self.ppo_loss(logprobs, trajs)
        self.engine.optimizer_zero_grad()
        loss.backward()
        self.engine.step()
