# Reviewer: same verl-style Megatron actor as e03 (loss_func(output) per
# micro-batch, global token mean with the token count all-reduced over the DP
# group, default kl_loss_type "low_var_kl"), but the trainer runs BOTH KL
# placements with ONE coefficient: compute_rewards puts -kl_coef * k3 in the
# per-token rewards (no_grad) and credits them by REINFORCE++ returns (reverse
# cumulative sum, gamma = 1), and loss_func adds kl_coef * k3 with its gradient,
# normalised by the same global token count as the policy-gradient term. The k3
# reward gives grad KL(pi||pi_ref) minus the token-level grad of KL(pi_ref||pi);
# the k3 loss adds that token-level term back: the sum is grad KL(pi||pi_ref).
# Verdict: correct (the "both" pairing of the rule book); neither k3 call is a finding.
from dataclasses import dataclass

import torch
import torch.distributed as dist

from megatron.core import parallel_state as mpu
from verl.utils.megatron.pipeline_parallel import make_batch_generator


def kl_penalty(logprob, ref_logprob, kl_penalty="kl"):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = (ref_logprob - logprob).clamp(min=-20, max=20)
        return torch.exp(kl) - kl - 1
    raise NotImplementedError(kl_penalty)


def global_token_mean(loss_mat, loss_mask, dp_group=None):
    global_tokens = loss_mask.sum().detach().clone()
    dist.all_reduce(global_tokens, group=dp_group)
    dp_size = dist.get_world_size(group=dp_group)
    return (loss_mat * loss_mask).sum() / global_tokens.clamp(min=1) * dp_size


@dataclass
class MegatronActorConfig:
    clip_ratio: float = 0.2
    use_kl_loss: bool = True
    use_kl_in_reward: bool = True
    kl_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"


class MegatronPPOActor:
    def __init__(self, config, actor_module=None, dp_group=None):
        self.config = config
        self.actor_module = actor_module
        self.dp_group = dp_group

    @torch.no_grad()
    def compute_rewards(self, data):
        response_mask = data["response_mask"].float()
        token_level_rewards = data["token_level_scores"].clone()
        if self.config.use_kl_in_reward:
            # ok: KL004
            kld = kl_penalty(data["old_log_probs"], data["ref_log_prob"], kl_penalty=self.config.kl_loss_type)
            token_level_rewards = token_level_rewards - self.config.kl_coef * kld * response_mask
        returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
        data["advantages"] = returns * response_mask
        return data

    def loss_func(self, data, output):
        log_prob = output["log_probs"]
        response_mask = data["response_mask"].float()
        ratio = torch.exp(log_prob - data["old_log_probs"])
        adv = data["advantages"]
        pg_mat = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - self.config.clip_ratio, 1 + self.config.clip_ratio))
        policy_loss = global_token_mean(pg_mat, response_mask, self.dp_group)
        stats = {"actor/pg_loss": policy_loss.detach().item()}
        if self.config.use_kl_loss:
            # ok: KL002
            kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty=self.config.kl_loss_type)
            kl_loss = global_token_mean(kld, response_mask, self.dp_group)
            policy_loss = policy_loss + kl_loss * self.config.kl_coef
            stats["actor/kl_loss"] = kl_loss.detach().item()
        return policy_loss, stats

    def update_policy(self, dataloader, forward_backward_func, n_micro_batch):
        for data in dataloader:
            batch_generator = make_batch_generator(data, vpp_size=len(self.actor_module))
            metric_micro_batch = forward_backward_func(
                forward_step_func=self.forward_step,
                data_iterator=batch_generator,
                model=self.actor_module,
                num_microbatches=n_micro_batch,
                forward_only=False,
            )
        return metric_micro_batch

    def forward_step(self, batch_iter, model):
        data = next(batch_iter)
        output = model(data["input_ids"], data["attention_mask"], data["position_ids"], labels=data["responses"])
        return output, lambda out: self.loss_func(data, out)
