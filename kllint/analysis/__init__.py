"""The analysis every rule shares: lowering code to the KL expression IR,
deciding roles and gradient flow, and classifying an estimator by its gradient."""
