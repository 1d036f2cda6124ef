# Reviewer: TRL-style GRPO loss driven by a typer CLI, as e03, but the CLI
# default is `beta = typer.Option(0.0, ...)` (like recent TRL, which dropped the
# KL term by default). The k3 branch is guarded by `if self.beta != 0.0`, so the
# default configuration never computes it and never loads a reference model's
# KL: the loss is the clipped policy gradient alone. Nothing is differentiated
# that claims to be a KL; the KL part of the gradient is exactly zero by design.
# Verdict: correct. The k3 line is tempting and stays silent.
from dataclasses import dataclass

import torch
import typer

from trl import GRPOTrainer as _UpstreamGRPOTrainer
from trl.trainer.utils import selective_log_softmax

app = typer.Typer(add_completion=False)


@dataclass
class GRPOArgs:
    beta: float = 0.0
    epsilon: float = 0.2
    max_completion_length: int = 256
    num_generations: int = 8


class GRPOLoss:
    def __init__(self, args: GRPOArgs):
        self.args = args
        self.beta = args.beta

    def __call__(self, per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask):
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.args.epsilon, 1 + self.args.epsilon)
        adv = advantages.unsqueeze(1)
        per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
        metrics = {}
        if self.beta != 0.0:
            delta = ref_per_token_logps - per_token_logps
            # ok: KL002
            per_token_kl = torch.expm1(delta) - delta
            per_token_loss = per_token_loss + self.beta * per_token_kl
            metrics["kl"] = ((per_token_kl * completion_mask).sum() / completion_mask.sum()).item()
        # constant normaliser (Dr. GRPO): sum over tokens / max length, mean over the batch
        loss = ((per_token_loss * completion_mask).sum(-1) / self.args.max_completion_length).mean()
        return loss, metrics


def build_trainer(model_name: str, args: GRPOArgs):
    trainer = _UpstreamGRPOTrainer(model=model_name, args=args)
    trainer.compute_grpo_loss = GRPOLoss(args)
    return trainer


@app.command()
def main(
    model_name: str = typer.Option("Qwen/Qwen2.5-0.5B-Instruct", help="Policy to train."),
    beta: float = typer.Option(0.0, help="KL coefficient; 0 disables the reference model."),
    epsilon: float = typer.Option(0.2, help="PPO clip range."),
    max_completion_length: int = typer.Option(256),
    num_generations: int = typer.Option(8),
):
    args = GRPOArgs(
        beta=beta,
        epsilon=epsilon,
        max_completion_length=max_completion_length,
        num_generations=num_generations,
    )
    trainer = build_trainer(model_name, args)
    trainer.train()


if __name__ == "__main__":
    app()
