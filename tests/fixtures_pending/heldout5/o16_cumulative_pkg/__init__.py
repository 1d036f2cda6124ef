"""Cumulative (reward-to-go) KL estimator, split over modules."""
