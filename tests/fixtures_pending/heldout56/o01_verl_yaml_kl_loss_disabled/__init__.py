# Reviewer: package marker for item o01_verl_yaml_kl_loss_disabled (see the modules beside it); no code.
