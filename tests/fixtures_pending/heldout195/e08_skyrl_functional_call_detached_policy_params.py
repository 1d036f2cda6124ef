# Reviewer: SkyRL-style policy worker with an in-place reference: the reference
# policy is the same module run through torch.func.functional_call with a frozen
# snapshot of its initial weights. The KL term has its own helper, _kl_term,
# given the batch: it runs both the policy and the reference through one
# `_logps_with(params, batch)` function, but the policy's params dict is built as
# `{n: p.detach() ...}`, like the snapshot. Those log-probs carry no gradient, so
# the k2 of the sequence log-ratio (a correct estimator) reaches the loss as a
# constant: the KL penalty has gradient exactly zero.
# Verdict: bug, KL005, reported inside _kl_term (given the batch), on the line
# that computes the estimate.
import torch
from torch.func import functional_call

from skyrl_train.training_batch import TrainingInputBatch
from skyrl_train.utils.torch_utils import masked_mean


class FunctionalRefPolicyWorker:
    def __init__(self, model, optimizer, cfg):
        self.model = model
        self.optimizer = optimizer
        self.cfg = cfg
        self.ref_params = {n: p.detach().clone() for n, p in model.named_parameters()}

    def _logps_with(self, params, batch):
        T = batch["responses"].size(1)
        out = functional_call(self.model, params, (batch["sequences"],), {"attention_mask": batch["attention_mask"]})
        logits = out.logits[:, -T - 1 : -1] / self.cfg["temperature"]
        return torch.log_softmax(logits, dim=-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)

    def _kl_term(self, batch):
        policy_params = {n: p.detach() for n, p in self.model.named_parameters()}
        logps = self._logps_with(policy_params, batch)
        with torch.no_grad():
            ref_logps = self._logps_with(self.ref_params, batch)
        seq_log_ratio = ((logps - ref_logps) * batch["loss_mask"]).sum(-1)
        # error: KL005
        return 0.5 * seq_log_ratio.square()

    def compute_loss(self, batch):
        T = batch["responses"].size(1)
        logits = self.model(batch["sequences"], attention_mask=batch["attention_mask"]).logits[:, -T - 1 : -1]
        action_logps = torch.log_softmax(logits / self.cfg["temperature"], dim=-1)
        action_logps = action_logps.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
        mask = batch["loss_mask"]
        ratio = torch.exp(action_logps - batch["old_action_log_probs"])
        adv = batch["advantages"].unsqueeze(-1)
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.cfg["eps_clip"], 1 + self.cfg["eps_clip"]) * adv)
        pg_loss = (-surr * mask).sum(-1).mean()
        loss = pg_loss
        if self.cfg["use_kl_loss"]:
            kl_loss = self._kl_term(batch).mean()
            loss = loss + self.cfg["kl_loss_coef"] * kl_loss
        return loss

    def training_step(self, batch: TrainingInputBatch):
        self.model.train()
        loss = self.compute_loss(batch)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["max_grad_norm"])
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {"loss": loss.item(), "grad_norm": grad_norm.item()}


DEFAULT_CFG = {"temperature": 1.0, "eps_clip": 0.2, "use_kl_loss": True, "kl_loss_coef": 0.05, "max_grad_norm": 1.0}
