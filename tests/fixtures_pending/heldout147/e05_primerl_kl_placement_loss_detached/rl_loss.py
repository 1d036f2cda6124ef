# Reviewer: prime-rl-style trainer. The KL is computed once, in the no_grad
# advantage stage, from the stored inference log-probs and the reference. With
# kl.placement="reward" it becomes a reward-to-go subtracted from the token
# advantages (correct); the shipped configs/train.yaml says placement="loss",
# and then compute_loss adds that same stored, detached KL to the loss. The
# term has no gradient path to the policy: the regulariser does nothing.
# Verdict: bug, KL005, reported on the line in compute_advantages that computes
# the estimate.
from pathlib import Path

import torch
import yaml

from prime_rl.trainer.model import get_model
from prime_rl.trainer.world import get_world

CONFIG = Path(__file__).parent / "configs" / "train.yaml"


def load_config(path=CONFIG):
    with open(path) as f:
        return yaml.safe_load(f)


def reverse_cumsum(x):
    return torch.flip(torch.cumsum(torch.flip(x, dims=[-1]), dim=-1), dims=[-1])


@torch.no_grad()
def compute_advantages(cfg, batch):
    """Outcome advantages, plus the KL penalty where configured."""
    kl_cfg = cfg.get("kl", {})
    mask = batch["loss_mask"]
    logprobs = batch["inference_logprobs"]
    ref_logprobs = batch["ref_logprobs"]
    # error: KL005
    kl = (logprobs - ref_logprobs) * mask
    token_adv = batch["advantages"].unsqueeze(-1) * mask
    if kl_cfg.get("placement", "reward") == "reward":
        token_adv = token_adv - kl_cfg.get("coef", 0.0) * reverse_cumsum(kl)
    batch["token_advantages"] = token_adv
    batch["kl"] = kl
    return batch


def compute_loss(cfg, logprobs, batch):
    loss_cfg = cfg.get("loss", {})
    kl_cfg = cfg.get("kl", {})
    mask = batch["loss_mask"]
    log_ratio = logprobs - batch["inference_logprobs"]
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1 - loss_cfg.get("clip_low", 0.2), 1 + loss_cfg.get("clip_high", 0.2))
    adv = batch["token_advantages"]
    pg = torch.maximum(-adv * ratio, -adv * clipped)
    loss = (pg * mask).sum(-1).mean()
    stats = {"pg_loss": loss.item(), "mismatch_kl": (log_ratio.detach() * mask).sum().item()}
    if kl_cfg.get("placement", "reward") == "loss":
        kl_loss = batch["kl"].sum(-1).mean()
        loss = loss + kl_cfg.get("coef", 0.0) * kl_loss
        stats["kl_loss"] = kl_loss.item()
    return loss, stats


def train(cfg, dataloader):
    world = get_world()
    model = get_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["optimizer"]["lr"])
    for step, batch in enumerate(dataloader):
        batch = compute_advantages(cfg, batch)
        logits = model(batch["input_ids"]).logits[:, :-1]
        logprobs = torch.gather(logits.log_softmax(-1), -1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
        loss, stats = compute_loss(cfg, logprobs, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["optimizer"]["max_norm"])
        optimizer.step()
        if world.is_master:
            print(step, stats)
