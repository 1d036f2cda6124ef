from .lowvar_trainer import LowVarKLGRPOTrainer

__all__ = ["LowVarKLGRPOTrainer"]
