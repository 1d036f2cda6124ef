# Reviewer: NeMo-RL-style clipped policy-gradient loss. It reads the stored
# per-token "advantages" (computed in advantages.py, KL already inside) and the
# generation log-probs from the batch data; it adds no KL term itself.
import torch


def masked_mean(values, mask, global_normalization_factor=None):
    denom = mask.sum() if global_normalization_factor is None else global_normalization_factor
    return (values * mask).sum() / denom


class ClippedPGLossFn:
    def __init__(self, cfg: dict):
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]
        self.token_level_loss = cfg.get("token_level_loss", True)

    def __call__(self, next_token_logits, data, global_valid_seqs, global_valid_toks):
        token_mask = data["token_mask"][:, 1:]
        advantages = data["advantages"][:, 1:]
        prev_logprobs = data["prev_logprobs"][:, 1:]
        next_tokens = data["input_ids"][:, 1:]
        logprobs = torch.nn.functional.log_softmax(next_token_logits[:, :-1].float(), dim=-1)
        curr_logprobs = logprobs.gather(-1, next_tokens.unsqueeze(-1)).squeeze(-1)
        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        loss1 = -advantages * ratios
        loss2 = -advantages * ratios_clamped
        per_token = torch.max(loss1, loss2)
        if self.token_level_loss:
            loss = masked_mean(per_token, token_mask, global_normalization_factor=global_valid_toks)
        else:
            loss = (masked_mean(per_token, token_mask, None) * token_mask.size(0)) / global_valid_seqs
        return loss, {"loss": loss.item(), "probs_ratio": masked_mean(ratios.detach(), token_mask).item()}
