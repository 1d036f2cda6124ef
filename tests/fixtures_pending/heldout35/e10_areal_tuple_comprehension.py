# Review: the nested `token_terms` returns a (policy-gradient, KL) tuple per micro-batch; the list
# comprehension collects them, zip(*...) transposes and torch.cat joins the pieces.  The KL half is the
# raw log-ratio with its gradient, and grad(logp - ref) = grad logp has zero expectation on-policy: the
# kl_ctl term never pulls the policy towards the reference.
import torch

from areal.api.cli_args import PPOActorConfig
from areal.utils.functional import gather_logprobs


def grpo_actor_loss(config: PPOActorConfig, logits_list, micro_batches):
    """Loss over several padded micro-batches that are optimised in one step."""

    def token_terms(logits, mb):
        logprobs = gather_logprobs(logits, mb["output_ids"], temperature=config.temperature)
        ratio = torch.exp(logprobs - mb["prox_logp"])
        clipped = ratio.clamp(1.0 - config.eps_clip, 1.0 + config.eps_clip)
        adv = mb["advantages"].unsqueeze(-1)
        pg = -torch.min(ratio * adv, clipped * adv)
        return pg, logprobs - mb["ref_logp"], mb["loss_mask"].float()

    # error: KL001
    pg_terms, kl_terms, masks = zip(*[token_terms(lg, mb) for lg, mb in zip(logits_list, micro_batches)])
    pg = torch.cat(pg_terms, dim=0)
    kl = torch.cat(kl_terms, dim=0)
    mask = torch.cat(masks, dim=0)

    per_token = pg + config.kl_ctl * kl
    # constant normaliser: batch size times the generation budget
    loss = (per_token * mask).sum() / (mask.shape[0] * config.max_new_tokens)
    stats = {
        "pg_loss": ((pg * mask).sum() / mask.sum()).detach(),
        "kl": ((kl * mask).sum() / mask.sum()).detach(),
    }
    return loss, stats


def train_batch(engine, config, micro_batches):
    engine.optimizer.zero_grad()
    logits_list = [engine.model(mb["input_ids"], attention_mask=mb["attention_mask"]).logits for mb in micro_batches]
    loss, stats = grpo_actor_loss(config, logits_list, micro_batches)
    loss.backward()
    engine.optimizer.step()
    return {k: v.item() for k, v in stats.items()}
