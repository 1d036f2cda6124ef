# Reviewer: the experience record and its micro-batch splitting; no KL maths.
"""Rollout records shared by the experience maker and the learner."""

from dataclasses import dataclass, field, fields
from typing import Dict, List

import torch


@dataclass
class Experience:
    sequences: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    action_log_probs: torch.Tensor
    ref_log_probs: torch.Tensor
    advantages: torch.Tensor
    info: Dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_actions(self) -> int:
        return self.action_mask.size(1)

    def to(self, device) -> "Experience":
        kwargs = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                kwargs[f.name] = value.to(device)
            elif isinstance(value, dict):
                kwargs[f.name] = {k: v.to(device) for k, v in value.items()}
            else:
                kwargs[f.name] = value
        return Experience(**kwargs)


def split_experience(experience: Experience, micro_batch_size: int) -> List[Experience]:
    batch_size = experience.sequences.size(0)
    chunks = []
    for start in range(0, batch_size, micro_batch_size):
        sl = slice(start, start + micro_batch_size)
        chunks.append(
            Experience(
                sequences=experience.sequences[sl],
                attention_mask=experience.attention_mask[sl],
                action_mask=experience.action_mask[sl],
                action_log_probs=experience.action_log_probs[sl],
                ref_log_probs=experience.ref_log_probs[sl],
                advantages=experience.advantages[sl],
                info={k: v[sl] for k, v in experience.info.items()},
            )
        )
    return chunks
