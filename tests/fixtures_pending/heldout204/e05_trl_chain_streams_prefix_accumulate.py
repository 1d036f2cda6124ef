# Reviewer: TRL-style GRPO trainer whose step chains two loss streams,
# `itertools.chain(self._pg_losses(batch), self._kl_losses(batch))`, and calls
# `loss.backward()` on each. The reference log-probs are awaited from a
# reference server before the streams start. `_kl_losses` writes the KL as a
# score function, `kl_to_go * logps`, with a detached weight built by
# `itertools.accumulate` over the time steps -- but accumulate runs FORWARD:
# the weight of token t is sum_{s<=t} logr_s (a prefix sum), not the
# reward-to-go sum_{s>=t}. The s<t terms vanish in expectation, so the
# expected gradient is the token-level partial gradient of KL(pi||pi_ref).
# Verdict: bug, KL003, reported on the `kl_penalty = (kl_to_go * logps ...)`
# line (score-function form: the line that multiplies the detached weight by
# the log-probs, named as a penalty).
import asyncio
import itertools

import torch

from trl import GRPOConfig
from trl.trainer.utils import selective_log_softmax


class ChainedGRPOTrainer:
    def __init__(self, args: GRPOConfig, model, ref_client, optimizer):
        self.args = args
        self.model = model
        self.ref_client = ref_client
        self.optimizer = optimizer
        self.beta = 0.04
        self.mb_size = 4

    def _get_per_token_logps(self, mb):
        logits = self.model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
        return selective_log_softmax(logits[:, :-1], mb["input_ids"][:, 1:])

    def _split(self, batch):
        for i in range(0, batch["input_ids"].shape[0], self.mb_size):
            yield {k: v[i : i + self.mb_size] for k, v in batch.items()}

    def _pg_losses(self, batch):
        for mb in self._split(batch):
            logps = self._get_per_token_logps(mb)
            coef = torch.exp(logps - logps.detach())
            per_token = -coef * mb["advantages"].unsqueeze(1)
            yield (per_token * mb["completion_mask"]).sum(-1).mean()

    def _kl_losses(self, batch):
        for mb in self._split(batch):
            logps = self._get_per_token_logps(mb)
            mask = mb["completion_mask"]
            log_ratio = ((logps - mb["ref_per_token_logps"]) * mask).detach()
            kl_to_go = torch.stack(list(itertools.accumulate(log_ratio.unbind(-1))), dim=-1)
            # error: KL003
            kl_penalty = (kl_to_go * logps * mask).sum(-1).mean()
            yield self.beta * kl_penalty

    async def training_step(self, batch):
        batch["ref_per_token_logps"] = await self.ref_client.get_per_token_logps(
            batch["input_ids"], batch["attention_mask"]
        )
        logs = []
        for loss in itertools.chain(self._pg_losses(batch), self._kl_losses(batch)):
            loss.backward()
            logs.append(loss.item())
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {"loss": sum(logs)}
