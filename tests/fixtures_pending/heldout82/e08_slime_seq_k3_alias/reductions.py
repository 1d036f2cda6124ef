# Reviewer: e08 reduction module: sum over samples of a per-sample value,
# divided by the global number of samples.
import torch


def get_sum_of_sample_mean(per_sample: torch.Tensor, num_samples: int) -> torch.Tensor:
    return per_sample.sum() / num_samples
