"""The ``kllint`` command: ``kllint [PATHS]...``, ``kllint rule CODE``, ``kllint rules``."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from kllint import __version__
from kllint.config import ConfigError, load_settings
from kllint.engine import LintResult, MissingPathError, lint_paths
from kllint.findings import Finding
from kllint.reporters import FORMATS, render
from kllint.rulebook import rule_page
from kllint.rules import RULES, lookup

TORCH_MISSING = "--confirm needs torch: pip install 'kllint[confirm]'"


class _DefaultToCheck(click.Group):
    """Runs ``check`` unless the first argument names a subcommand, so that
    ``kllint src/`` lints. The price: a path spelled like a subcommand
    (``rule``, ``rules``, ``check``) must be written ``./rules`` or after
    ``kllint check``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            args = ["check", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultToCheck, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Find KL-divergence regularisers whose gradient is wrong in RL code."""


@main.command(
    epilog="Other commands: `kllint rule CODE` prints a rule's page, `kllint rules` lists them."
)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--select",
    multiple=True,
    metavar="RULES",
    help="Check only these rules: codes, prefixes (KL00) or names, comma-separated. "
    "Replaces the configured selection.",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="RULES",
    help="Also skip these rules (codes, prefixes or names, comma-separated).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(FORMATS),
    default="full",
    show_default=True,
    help="Output format.",
)
@click.option(
    "--exit-zero",
    is_flag=True,
    help="Exit 0 even with findings or unparsable files (errors of kllint itself still exit 2).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Read [tool.kllint] from this file instead of the nearest pyproject.toml.",
)
@click.option(
    "--confirm",
    is_flag=True,
    help="Check each finding's claim about the gradient numerically with torch "
    "(pip install 'kllint[confirm]').",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes for large trees (default: one per CPU; 1 to stay in one process).",
)
# --- fix mode (kllint.fix): Ruff's flags and exit codes
@click.option("--fix", is_flag=True, help="Apply the safe fixes (verified rewrites).")
@click.option("--unsafe-fixes", is_flag=True, help="Also offer and apply the unsafe fixes.")
@click.option(
    "--diff",
    is_flag=True,
    help="Print a unified diff of what --fix would write; change nothing (exit 1 if it would).",
)
@click.option("--show-fixes", is_flag=True, help="List the fixes applied (or that would be).")
# --- end of fix mode
@click.version_option(__version__, "--version", prog_name="kllint")
def check(
    paths: tuple[Path, ...],
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    output_format: str,
    exit_zero: bool,
    config_path: Path | None,
    confirm: bool,
    jobs: int | None,
    fix: bool = False,
    unsafe_fixes: bool = False,
    diff: bool = False,
    show_fixes: bool = False,
) -> None:
    """Lint PATHS (default: the current directory) for KL regularisers whose
    gradient is not the one intended.

    \b
    Exit status:
      0  no findings
      1  findings, or a file that could not be checked (a syntax error, not
         UTF-8); as in Ruff, the other files are still linted and reported
      2  a usage or configuration error, a missing path, or kllint crashing
    """
    targets = list(paths) or [Path(".")]
    try:
        settings = load_settings(
            targets, config=config_path, select=_split(select) or None, ignore=_split(ignore)
        )
        # --confirm needs each finding's KL site, which stays in this process.
        result = lint_paths(targets, settings, jobs=1 if confirm else jobs)
    except (ConfigError, MissingPathError) as err:
        _fail(f"error: {err}")
    if confirm and result.findings:
        _confirm(result)
    if result.findings and (fix or diff or show_fixes or output_format in ("json", "sarif")):
        from kllint.fix.command import FixMode

        mode = FixMode(fix=fix, unsafe=unsafe_fixes, diff=diff, show=show_fixes)
        if mode.run(result, settings, output_format) is not None:
            raise click.exceptions.Exit(mode.exit_code or 0)

    color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    click.echo(render(result, output_format, color=color), nl=False, color=color)
    if result.files_checked == 0 and not result.errors:
        click.echo("kllint: warning: no Python files found", err=True)
    if result.internal_errors:
        click.echo(
            f"kllint: error: kllint crashed on {result.internal_errors} file(s) (reported as E999); "
            "this is a bug in kllint",
            err=True,
        )
        raise click.exceptions.Exit(2)
    if (result.findings or result.errors) and not exit_zero:
        raise click.exceptions.Exit(1)


@main.command()
@click.argument("code_or_name")
def rule(code_or_name: str) -> None:
    """Print a rule's page: what it does, why it is bad, an example and the fix."""
    matched = lookup(code_or_name)
    exact = [r for r in matched if code_or_name.strip().upper() in (r.code, r.name.upper())]
    if not matched:
        _fail(f"error: unknown rule {code_or_name!r} (see `kllint rules`)")
    if len(matched) > 1 and not exact:
        codes = ", ".join(r.code for r in matched)
        _fail(f"error: {code_or_name!r} matches several rules ({codes}); name one")
    click.echo(rule_page((exact or matched)[0].code).rstrip("\n"))


@main.command()
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also train a tabular policy with each estimator and save the true KL curves as a PNG.",
)
def estimators(plot: str | None) -> None:
    """Print the exact verdicts of the canonical KL surrogates (needs torch)."""
    try:
        from kllint.harness import main_estimators
    except ImportError as exc:  # pragma: no cover - depends on the install
        _fail(f"estimators needs torch: pip install 'kllint[confirm]' ({exc})")
    raise SystemExit(main_estimators(plot))


@main.command("rules")
def list_rules() -> None:
    """List every rule: code, name and what fires it."""
    width = max(len(r.name) for r in RULES.values())
    for r in RULES.values():
        click.echo(f"{r.code}  {r.name:<{width}}  {r.summary}")


def _confirm(result: LintResult) -> None:
    """Run the torch harness on the findings (it fills ``Finding.confirmation``).
    Imported here: torch takes seconds to import and is an optional extra."""
    try:
        importlib.import_module("torch")
    except ImportError:
        _fail(TORCH_MISSING)
    try:
        harness = importlib.import_module("kllint.harness")
    except ModuleNotFoundError as err:
        if err.name is not None and not err.name.startswith("kllint"):
            _fail(f"--confirm needs {err.name}: pip install 'kllint[confirm]'")
        _fail("--confirm is not available: this kllint has no confirmation harness")
    confirm_findings: Any = getattr(harness, "confirm_findings", None)
    if confirm_findings is None:
        _fail("--confirm is not available: kllint.harness has no confirm_findings yet")
    try:
        confirmed = confirm_findings(result.findings)
    except Exception as err:
        _fail(f"error: --confirm failed: {type(err).__name__}: {err} (a bug in kllint)")
    if confirmed is not None:  # it may also fill the findings in place
        result.findings = sorted(confirmed, key=Finding.sort_key)


def _split(values: Sequence[str]) -> list[str]:
    """``--select KL001,KL002 --select KL005`` -> ``["KL001", "KL002", "KL005"]``."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _fail(message: str) -> NoReturn:
    click.echo(f"kllint: {message}", err=True)
    raise click.exceptions.Exit(2)
