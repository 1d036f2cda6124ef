"""NeMo-Aligner style actor for a critic-free PPO variant.

The KL to the initial policy is taken out of the rewards
(``use_kl_in_reward: False``) and added to the actor loss instead, with the
"low variance" estimator written on the probability ratio
``pi_init / pi``: ``ratio - log(ratio) - 1``. The loss is built inside the
closure Megatron's pipeline schedule calls on the last stage.
"""

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from omegaconf import DictConfig


def from_parallel_logits_to_logprobs(vocab_parallel_logits, target, inference_only=False, higher_stability=True):
    """Log-probs of ``target[:, 1:]`` under the logits of ``target[:, :-1]``."""
    logits = vocab_parallel_logits[:, :-1].float()
    if higher_stability:
        logits = logits - logits.max(dim=-1, keepdim=True).values.detach()
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.gather(log_probs, -1, target[:, 1:].unsqueeze(-1)).squeeze(-1)


def masked_mean(values, mask, dim=None):
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def average_losses_across_data_parallel_group(losses):
    averaged = torch.cat([loss.clone().detach().view(1) for loss in losses])
    if parallel_state.get_data_parallel_world_size() > 1:
        torch.distributed.all_reduce(averaged, group=parallel_state.get_data_parallel_group())
        averaged = averaged / parallel_state.get_data_parallel_world_size()
    return averaged


class MegatronGPTActorModel:
    def __init__(self, cfg: DictConfig, model):
        self.cfg = cfg
        self.model = model
        self.ratio_eps = cfg.ppo.ratio_eps
        self.init_policy_kl_coef = cfg.ppo.init_policy_kl_coef

    def get_actor_forward_output_and_loss_func(self):
        def fwd_output_and_loss_func(data_iterator, model):
            batch = next(data_iterator)
            response_tokens = batch["response_tokens"]
            advantages = batch["advantages"]
            mask = batch["mask"]
            prev_log_probs = batch["prev_logprobs"]
            init_log_probs = batch["init_logprobs"]

            attention_mask, position_ids = batch["attention_mask"], batch["position_ids"]
            parallel_logits = model(response_tokens, position_ids, attention_mask, labels=None)

            def loss_func(parallel_logits):
                curr_log_probs = from_parallel_logits_to_logprobs(
                    vocab_parallel_logits=parallel_logits, target=response_tokens, higher_stability=True
                )

                ratios = (curr_log_probs - prev_log_probs).exp()
                ratios_clamped = ratios.clamp(1.0 - self.ratio_eps, 1.0 + self.ratio_eps)
                loss1 = -advantages * ratios
                loss2 = -advantages * ratios_clamped
                actor_loss = masked_mean(torch.max(loss1, loss2), mask)

                init_ratio = torch.exp(init_log_probs - curr_log_probs)
                # error: KL002
                init_policy_kl = init_ratio - torch.log(init_ratio) - 1
                kl_loss = masked_mean(init_policy_kl, mask)
                loss = actor_loss + self.init_policy_kl_coef * kl_loss

                with torch.no_grad():
                    ppo_ratio = masked_mean(ratios.detach(), mask)
                    ppo_ratio_clamped = masked_mean(ratios_clamped.detach(), mask)

                reduced = average_losses_across_data_parallel_group([loss, kl_loss, ppo_ratio, ppo_ratio_clamped])
                return loss, {
                    "loss": reduced[0],
                    "init_policy_kl": reduced[1],
                    "ppo_ratio": reduced[2],
                    "ppo_ratio_clamped": reduced[3],
                }

            return parallel_logits, loss_func

        return fwd_output_and_loss_func

    def get_loss_and_metrics(self, batch, forward_only):
        seq_length = batch["response_tokens"].shape[1]
        fwd_bwd_function = get_forward_backward_func()
        losses_reduced_per_micro_batch = fwd_bwd_function(
            forward_step_func=self.get_actor_forward_output_and_loss_func(),
            data_iterator=iter([batch]),
            model=self.model,
            num_microbatches=1,
            forward_only=forward_only,
            seq_length=seq_length,
            micro_batch_size=batch["response_tokens"].shape[0],
        )
        metrics = {}
        for key in ("loss", "init_policy_kl", "ppo_ratio", "ppo_ratio_clamped"):
            metrics[key] = torch.stack([m[key] for m in losses_reduced_per_micro_batch]).mean().item()
        return metrics["loss"], metrics
