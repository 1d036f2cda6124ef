"""Online DPO / Nash-MD style: a score-function KL term per token (TRL-like)."""
import torch


def get_logprobs(model, prompt_completion_ids, completion_len):
    logits = model(prompt_completion_ids).logits[:, -completion_len - 1 : -1]
    return torch.gather(logits.log_softmax(-1), 2, prompt_completion_ids[:, -completion_len:].unsqueeze(-1)).squeeze(-1)


class NashTrainer:
    def __init__(self, model, ref_model, accelerator, beta=0.1):
        self.model = model
        self.ref_model = ref_model
        self.accelerator = accelerator
        self.beta = beta

    def compute_losses(self, ids, completion_len, mask, probability):
        model_logprobs = get_logprobs(self.model, ids, completion_len)
        with torch.no_grad():
            ref_logprobs = get_logprobs(self.ref_model, ids, completion_len)
        score = (probability - 0.5) * (model_logprobs * mask).sum(1)
        log_ratio = model_logprobs - ref_logprobs
        # error: KL003
        kl_div_loss = ((log_ratio.detach() * model_logprobs) * mask).sum(1)
        loss = self.beta * kl_div_loss - score
        return loss.mean()

    def training_step(self, ids, completion_len, mask, probability):
        loss = self.compute_losses(ids, completion_len, mask, probability)
        self.accelerator.backward(loss)
        return loss.detach()
