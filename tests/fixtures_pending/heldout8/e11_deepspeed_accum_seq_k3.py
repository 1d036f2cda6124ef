"""DeepSpeed micro-batch loop with k3 of the sequence log-ratio as a loss (bug: KL002).

The anchor term sums the token log-ratio to a frozen ``anchor`` model over the
response, L = sum_t (logp_t - anchor_lp_t), and penalises
k3(L) = exp(-L) + L - 1. Differentiated as a loss its gradient is
(1 - exp(-L)) grad log pi(y), and E_{y~pi}[(1 - pi_ref(y)/pi(y)) grad log pi(y)]
= grad KL(pi_ref||pi) of the sequence: the swapped divergence. Scaling by the
accumulation steps and calling engine.backward does not change that.
"""

import torch


def response_logps(engine_or_model, input_ids, attention_mask, response_mask):
    logits = engine_or_model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    lp = torch.gather(logits.log_softmax(-1), 2, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return lp * response_mask[:, 1:]


class AnchoredPolicyTrainer:
    def __init__(self, engine, anchor_model, anchor_coef=0.1, gradient_accumulation_steps=4):
        self.engine = engine  # deepspeed.initialize(...)[0]
        self.anchor_model = anchor_model
        self.anchor_coef = anchor_coef
        self.gas = gradient_accumulation_steps

    def anchor_penalty(self, lp, anchor_lp, response_mask):
        seq_log_ratio = ((lp - anchor_lp) * response_mask).sum(-1)
        # error: KL002
        seq_kl = torch.exp(-seq_log_ratio) + seq_log_ratio - 1.0
        return seq_kl.mean()

    def train_batch(self, micro_batches):
        metrics = []
        for mb in micro_batches:
            lp = response_logps(self.engine, mb["input_ids"], mb["attention_mask"], mb["response_mask"])
            with torch.no_grad():
                anchor_lp = response_logps(self.anchor_model, mb["input_ids"], mb["attention_mask"], mb["response_mask"])
            mask = mb["response_mask"][:, 1:].float()

            pg_loss = -(mb["advantages"] * lp.sum(-1)).mean()
            kl_loss = self.anchor_penalty(lp, anchor_lp, mask)
            loss = (pg_loss + self.anchor_coef * kl_loss) / self.gas

            self.engine.backward(loss)
            self.engine.step()  # DeepSpeed only steps the optimiser at accumulation boundaries
            metrics.append({"pg_loss": pg_loss.item(), "anchor_kl": kl_loss.item()})
        return metrics
