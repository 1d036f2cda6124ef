# Reviewer: package item e06 (see learner.py for the verdict and the annotation).
