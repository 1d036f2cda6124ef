import argparse
import functools

import torch

from .estimators import token_kl
from .losses import regularised_pg_loss


def get_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--beta", type=float, default=0.05)
    p.add_argument("--kl-estimator", type=str, default="k2", choices=["k1", "k2", "k3"])
    p.add_argument("--ent-coef", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=5e-7)
    return p.parse_args(argv)


class PolicyLearner:
    def __init__(self, policy, ref_policy, optimizer, args):
        self.policy, self.ref_policy, self.optimizer, self.args = policy, ref_policy, optimizer, args
        self.kl_fn = functools.partial(token_kl, estimator=args.kl_estimator)

    def learn(self, batch):
        logps, entropy = self.policy.logps_and_entropy(batch["input_ids"], batch["response_mask"])
        with torch.no_grad():
            ref_logps, _ = self.ref_policy.logps_and_entropy(batch["input_ids"], batch["response_mask"])
        rewards = batch["rewards"]
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        loss, info = regularised_pg_loss(
            logps, ref_logps, advantages, batch["response_mask"], self.kl_fn, self.args.beta, entropy, self.args.ent_coef
        )
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return info
