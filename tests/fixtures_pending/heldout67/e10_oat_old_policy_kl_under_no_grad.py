# Reviewer: an oat-style PPO learner with a KL-to-old-policy penalty (the
# "PPO-KL" variant) instead of clipping. The learner already measures the KL to
# the behaviour policy for logging inside a no_grad block; this code reuses that
# tensor as the penalty term of the loss.
# Verdict: BUG (KL005). The penalty is computed under torch.no_grad(): it has no
# gradient path to the policy, so the only thing it does is shift the reported
# loss; the trust region is absent.
import torch
from oat.learners.rl import RLLearner
from oat.utils.ops import masked_mean


class PPOKLLearner(RLLearner):
    def __init__(self, args, *a, **kw):
        super().__init__(args, *a, **kw)
        self.kl_old_coef = args.kl_old_coef

    def ppo_kl_loss(self, new_logps, old_logps, advantages, response_masks):
        ratio = torch.exp(new_logps - old_logps)
        pg_loss = -(ratio * advantages[:, None] * response_masks).sum(-1).mean()

        with torch.no_grad():
            log_ratio = new_logps - old_logps
            # error: KL005
            kl_old = ((ratio - 1) - log_ratio) * response_masks
            kl_old = kl_old.sum(-1).mean()
            clipped = ((ratio - 1).abs() > 0.2).float()

        loss = pg_loss + self.kl_old_coef * kl_old
        infos = {
            "pg_loss": pg_loss.detach(),
            "kl_old": kl_old,
            "clip_ratio": masked_mean(clipped, response_masks),
        }
        return loss, infos

    def learning_step(self, trajectory):
        input_ids = trajectory["input_ids"]
        att_mask = trajectory["attention_mask"]
        response_masks = trajectory["action_mask"][:, 1:]
        old_logps = trajectory["old_logps"]
        advantages = trajectory["advantages"]
        infos = {}
        for _ in range(self.args.num_ppo_epochs):
            for mb in torch.randperm(len(input_ids)).split(self.args.train_batch_size_per_device):
                logits = self.model(input_ids[mb], attention_mask=att_mask[mb])["logits"].float()
                new_logps = torch.gather(logits[:, :-1].log_softmax(-1), 2, input_ids[mb][:, 1:].unsqueeze(-1)).squeeze(-1)
                loss, infos = self.ppo_kl_loss(new_logps, old_logps[mb], advantages[mb], response_masks[mb])
                self.strategy.backward(loss, self.model, self.optimizer)
                self.strategy.optimizer_step(self.optimizer, self.model, self.scheduler)
        return {k: float(v) for k, v in infos.items()}
