import torch
import torch.nn.functional as F

from .config import DistillConfig
from .losses import kl_penalty, masked_mean


class GOLDStyleTrainer:
    def __init__(self, model, teacher_model, args=None):
        self.model = model
        self.teacher_model = teacher_model
        self.args = args if args is not None else DistillConfig()
        self.kl_estimator = self.args.kl_estimator
        self.beta = self.args.beta

    def _token_logps(self, model, input_ids, completion_ids):
        logits = model(input_ids=input_ids).logits[:, -completion_ids.size(1) - 1 : -1]
        logits = logits / self.args.temperature
        logps = F.log_softmax(logits, dim=-1)
        return torch.gather(logps, -1, completion_ids.unsqueeze(-1)).squeeze(-1)

    def compute_loss(self, model, inputs):
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)

        student_logps = self._token_logps(model, input_ids, completion_ids)
        with torch.no_grad():
            teacher_logps = self._token_logps(self.teacher_model, input_ids, completion_ids)

        # error: KL002
        per_token_kl = kl_penalty(student_logps, teacher_logps, kind=self.kl_estimator)
        loss = self.beta * masked_mean(per_token_kl, completion_mask)
        return loss
