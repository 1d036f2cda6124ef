"""Suppression comments.

``# noqa`` and ``# kllint: ignore`` silence every rule on their line;
``# noqa: KL002,KL003``, ``# noqa: differentiated-k3-estimate`` and
``# kllint: ignore[KL002]`` only the rules they name (a code or a name,
not a prefix, as in Ruff). A finding that spans lines is silenced by a
comment on its first or its last line, where a formatter leaves it.

Comments are found with ``tokenize``, so ``"# noqa"`` inside a string
silences nothing.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Mapping

from kllint.findings import Finding

_NOQA = re.compile(r"#\s*noqa(?![\w-])(?::\s*(?P<codes>[\w-]+(?:[\s,]+[\w-]+)*))?", re.IGNORECASE)
_KLLINT_IGNORE = re.compile(
    r"#\s*kllint:\s*ignore(?![\w-])(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE
)

# line -> the upper-cased codes and names silenced there; ``None``: everything.
Suppressions = Mapping[int, "frozenset[str] | None"]


def parse_suppressions(source: str) -> dict[int, frozenset[str] | None]:
    table: dict[int, frozenset[str] | None] = {}
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    try:
        for token in tokens:
            if token.type != tokenize.COMMENT:
                continue
            line = token.start[0]
            for match in (*_NOQA.finditer(token.string), *_KLLINT_IGNORE.finditer(token.string)):
                codes = match.group("codes")
                if codes is None and token.string[match.end() :].startswith("["):
                    continue  # ``# kllint: ignore[KL002`` unterminated: silences nothing
                names = frozenset(re.findall(r"[\w-]+", codes.upper())) if codes else None
                previous = table.get(line, frozenset())
                table[line] = None if names is None or previous is None else previous | names
    except (tokenize.TokenError, SyntaxError):
        pass  # keep the comments before the bad token; the parser reports the error
    return table


def is_suppressed(finding: Finding, suppressions: Suppressions) -> bool:
    for line in {finding.line, finding.end_line}:
        if line not in suppressions:
            continue
        names = suppressions[line]
        if names is None or finding.code.upper() in names or finding.name.upper() in names:
            return True
    return False
