"""RLOO (leave-one-out REINFORCE) with the KL to the initial model in the sequence reward."""

from .rloo import RLOOArgs, RLOOExperienceMaker, RLOOTrainer

__all__ = ["RLOOArgs", "RLOOExperienceMaker", "RLOOTrainer"]
