"""``kllint --fix``: rewrite a KL pitfall into a value-preserving surrogate whose
gradient is that of KL(pi||pi_ref), in the user's own code, and prove it.

* :mod:`kllint.fix.adapter` is the only module that reads the analysis
  (findings, KL sites, the IR);
* :mod:`kllint.fix.plan` decides what replaces an expression, and how safe it is;
* :mod:`kllint.fix.scope` says where a name is bound, and so where a rewrite may go;
* :mod:`kllint.fix.apply` edits the LibCST tree, computes Ruff-style edits and
  diffs, and writes files atomically;
* :mod:`kllint.fix.verify` re-parses, re-lints, re-plans (idempotence) and
  checks the rewritten term's gradient profile; :mod:`kllint.fix.numeric`
  (torch) confirms it with the harness and compares forward values;
* :mod:`kllint.fix.run` ties them together; :mod:`kllint.fix.command` is
  what ``--fix``, ``--unsafe-fixes``, ``--diff`` and ``--show-fixes`` do.
"""

from kllint.fix.plan import FIXABLE_CODES, Applicability
from kllint.fix.run import FileFixes, fix_result

__all__ = ["FIXABLE_CODES", "Applicability", "FileFixes", "fix_result"]
