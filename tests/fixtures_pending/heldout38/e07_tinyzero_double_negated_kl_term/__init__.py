# Reviewer: kl_utils.kl_objective_term returns the KL already signed for an objective
# (`-coef * k2`), and the trainer subtracts it again as if it were a penalty. The double
# negation turns the (correct) sequence-level k2 penalty into a bonus once the objective
# is negated into the loss.
