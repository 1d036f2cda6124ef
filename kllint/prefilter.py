"""Which files can hold a KL term, from their text alone.

A KL term compares the log-probabilities of two policies, so a file that can
hold one either says KL, names a log-probability (``logprobs``,
``ref_log_probs``, ``old_lp``, ``pi_ref``), or computes one from logits or
probabilities (``log_softmax``, ``logsumexp``, ``.log_prob(...)``,
``torch.log(probs)``, a negated ``cross_entropy``). Nothing here asks for a
loss: a per-token penalty written in one file is often backpropagated by a
caller in another, and it must be analysed whatever its functions and
variables are called.

Every other file is not read by the analysis at all, not even parsed for its
syntax. A file that does not pass is still parsed when a file that passes
calls a helper it defines.

One compiled expression over the lowercased text, each of its branches
starting with a literal (``kl``, ``log``, ``prob``, ``.log(``), so that the
regular-expression engine skips ahead in C: a scan of every identifier in
Python cost more than the rest of a warm run. It imports only the policy
words of the analysis (``analysis/policy_words.py``, no LibCST), so the engine
decides in its own process which files need a worker.
"""

from __future__ import annotations

import re

from kllint.analysis.policy_words import OLD_WORDS, REFERENCE_WORDS

# Words naming the policy whose probabilities these are: the reference and
# behaviour words of the role vocabulary, and the current policy's
# (``pi_ref``, ``ref_probs``, ``old_pi``, ``new_probs``).
POLICY_WORDS = sorted(
    REFERENCE_WORDS
    | OLD_WORDS
    | {"new", "cur", "curr", "current", "online", "student", "policy", "actor"}
)

# What a log of probabilities is taken of: a word for probabilities, a
# softmax, a lone p or q, or the name of a policy (``torch.log(new / old)``).
_PROBABILITY = (
    r"(?<![a-z])(?:probs?|pis?|softmax|sigmoid|[pq]|" + "|".join(POLICY_WORDS) + r")(?![a-z])"
)

# Branches are matched against the lowercased text. "Not after a letter" is
# written as a look-behind after the literal, never before it: a branch that
# starts with a look-behind is tried at every position of the text.
_SIGNALS = [
    # It says KL: kl, kl_div, KLDivLoss, kld, kl_coef, "KL" in a comment.
    r"kl(?<![a-z]kl)(?:d|div(?:loss)?)?(?![a-z])",
    r"kullback",
    # It names a log-probability (``roles.LOGPROB_WORDS``, and "log" followed
    # by ``roles.AFTER_LOG_WORDS``): logp, logps, logprobs, log_probs,
    # refLogProbs, log_pi, loglik, log_likelihood; or computes one:
    # log_softmax, logsumexp, logsigmoid.
    r"log_?(?:prob(?:abilit(?:y|ies))?s?|ps?|pis?|lik(?:elihoods?)?|softmax|sumexp|sigmoid)"
    r"(?![a-z])",
    r"lp(?<![a-z]lp)(?:s|robs?)?(?![a-z])",  # lp, ref_lps, lprobs
    # A probability named after its policy: ref_probs, pi_old, refpi.
    "(?:prob|pi)(?:"
    + "|".join(f"(?<={w}{s}{p})" for w in POLICY_WORDS for s in ("", "_") for p in ("prob", "pi"))
    + ")s?(?![a-z])",
    rf"(?:probs?|pis?)_(?:{'|'.join(POLICY_WORDS)})(?![a-z])",
    # The log of probabilities: torch.log(probs), torch.log(pi / pi_ref),
    # torch.log(new / old), probs.log(); not math.log(n) nor
    # torch.log(scale + 1), which most logs in model code are.
    r"\.log\((?<!math\.log\()(?<!np\.log\()[^()\n]{0,80}?" + _PROBABILITY,
    r"\.log\(\)",  # a tensor's own log: (p + eps).log(), probs.log()
    # A negated cross-entropy is a log-probability: -F.cross_entropy(logits, ids).
    r"-\s*(?:[a-z_][a-z0-9_]*\.)*(?:cross_entropy|nll_loss)\(",
]
_CAN_HOLD_KL = re.compile("|".join(f"(?:{s})" for s in _SIGNALS))


def may_hold_kl_term(source: str) -> bool:
    """Whether the text of a file can hold a KL term. A file wrongly kept
    costs time; a file wrongly skipped costs findings: this errs towards
    keeping."""
    return _CAN_HOLD_KL.search(source.lower()) is not None


def must_analyse(source: str, configured_roles: bool = False) -> bool:
    """Whether a file is analysed. With role patterns in the configuration,
    any name may be a log-prob, so every file is."""
    return configured_roles or may_hold_kl_term(source)
