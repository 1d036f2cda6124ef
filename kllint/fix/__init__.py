"""``kllint --fix``: rewrite a KL pitfall into a value-preserving surrogate whose
gradient is that of KL(pi||pi_ref), in the user's own code, and prove it.

* :mod:`kllint.fix.adapter` is the only module that reads the analysis
  (findings, KL sites, the IR);
* :mod:`kllint.fix.plan` decides which expression to replace and with what text;
* :mod:`kllint.fix.apply` edits the LibCST tree, computes Ruff-style edits and
  diffs, and writes files atomically;
* :mod:`kllint.fix.verify` re-parses, re-lints, re-plans (idempotence) and,
  with torch, confirms the rewritten expression numerically;
* :mod:`kllint.fix.run` ties them together for the command line.
"""

from kllint.fix.plan import FIXABLE_CODES, Applicability
from kllint.fix.run import FileFixes, fix_result

__all__ = ["FIXABLE_CODES", "Applicability", "FileFixes", "fix_result"]
