# Reviewer: slime-style Megatron actor whose defaults live in a JSON document
# embedded in the module and merged with CLI overrides. The default
# `kl.logprob_source` is "rollout", so `policy_loss_function` builds the KL
# term from `rollout_log_probs` (returned by the inference engine, no gradient)
# instead of the fresh `log_probs`. The estimator itself is right (k2 of the
# sequence log-ratio) but the term added to the loss is a constant for autograd:
# the KL regulariser does nothing, while the loss still prints it.
# Verdict: bug, KL005, reported on the `kl = 0.5 * (...)` line that computes the
# estimate.
import argparse
import json
from types import SimpleNamespace

import torch

from slime.backends.megatron_utils import get_batch, forward_only
from slime.utils.ppo_utils import compute_policy_loss

_DEFAULTS_JSON = """
{
  "model": {"hf_checkpoint": "Qwen/Qwen3-4B", "micro_batch_size": 1},
  "loss": {"eps_clip": 0.2, "eps_clip_high": 0.28},
  "kl": {
    "use_kl_loss": true,
    "kl_loss_coef": 0.01,
    "kl_loss_type": "seq_k2",
    "logprob_source": "rollout"
  }
}
"""
DEFAULTS = json.loads(_DEFAULTS_JSON)


def load_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--override", action="append", default=[], help="section.key=json_value")
    ns = parser.parse_args(argv if argv is not None else [])
    cfg = json.loads(json.dumps(DEFAULTS))
    for item in ns.override:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        cfg[section][name] = json.loads(value)
    return SimpleNamespace(**{k: SimpleNamespace(**v) for k, v in cfg.items()})


def policy_loss_function(args, log_probs, old_log_probs, ref_log_probs, rollout_log_probs, advantages, loss_mask):
    ratio = torch.exp(log_probs - old_log_probs)
    clipped = ratio.clamp(1 - args.loss.eps_clip, 1 + args.loss.eps_clip_high)
    pg_loss = (torch.maximum(-advantages * ratio, -advantages * clipped) * loss_mask).sum(-1).mean()
    loss = pg_loss
    report = {"pg_loss": pg_loss.detach()}
    if args.kl.use_kl_loss:
        assert args.kl.kl_loss_type == "seq_k2", args.kl.kl_loss_type
        if args.kl.logprob_source == "rollout":
            kl_log_probs = rollout_log_probs
        else:
            kl_log_probs = log_probs
        # error: KL005
        kl = 0.5 * ((kl_log_probs - ref_log_probs) * loss_mask).sum(-1).pow(2)
        kl_loss = kl.mean()
        loss = loss + args.kl.kl_loss_coef * kl_loss
        report["kl_loss"] = kl_loss.detach()
    return loss, report


def train_step(args, model, optimizer, data_iterator):
    batch = get_batch(data_iterator, ["tokens", "loss_masks", "advantages", "log_probs", "ref_log_probs", "rollout_log_probs"])
    log_probs = forward_only(model, batch["tokens"])
    loss, report = policy_loss_function(
        args,
        log_probs,
        batch["log_probs"],
        batch["ref_log_probs"],
        batch["rollout_log_probs"],
        batch["advantages"],
        batch["loss_masks"],
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return report


if __name__ == "__main__":
    print(load_args())
