"""The ``kllint`` command: ``kllint check [PATHS]...`` (``kllint [PATHS]...``
for short), ``kllint rule CODE``, ``kllint rules``, ``kllint estimators``."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import click

# ``deferred`` first, before anything imports the analysis: a run answered
# from the cache never parses, and LibCST takes longer to import than such a
# run takes.
from kllint import __version__, deferred  # noqa: F401
from kllint.cache import Cache
from kllint.config import ConfigError, Settings, describe_settings, load_settings
from kllint.discovery import discover
from kllint.engine import MissingPathError, display_path, lint_paths, lint_source
from kllint.findings import LintResult
from kllint.reporters import FORMATS, render
from kllint.reporters import text as reporters_text
from kllint.reporters.common import location
from kllint.rulebook import rule_page
from kllint.rules import RULES, lookup
from kllint.suppression import add_noqa_comments


class _DefaultToCheck(click.Group):
    """Runs ``check`` unless the first argument names a subcommand or is the
    group's own ``--help``/``--version``, so that ``kllint src/`` lints. The
    price: a path spelled like a subcommand (``rule``, ``rules``, ``check``)
    must be written ``./rules`` or after ``kllint check``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in _GROUP_OPTIONS):
            args = ["check", *args]
        return super().parse_args(ctx, args)


_GROUP_OPTIONS = ("-h", "--help", "-V", "--version")


@click.group(
    cls=_DefaultToCheck,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="`kllint PATH` is short for `kllint check PATH`.",
)
@click.version_option(__version__, "-V", "--version", message="kllint %(version)s")
def main() -> None:
    """Find KL-divergence regularisers whose gradient is wrong in RL code."""


@main.command(
    epilog="Other commands: `kllint rule CODE` prints a rule's page, `kllint rules` lists them, "
    "`kllint estimators` computes the estimator table (needs torch)."
)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path, allow_dash=True))
@click.option(
    "--select",
    multiple=True,
    metavar="RULES",
    help="Check only these rules: codes, prefixes (KL00) or names, comma-separated. "
    "Replaces the configured selection.",
)
@click.option(
    "--extend-select",
    multiple=True,
    metavar="RULES",
    help="Also check these rules, on top of the configured selection.",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="RULES",
    help="Also skip these rules (codes, prefixes or names, comma-separated).",
)
@click.option(
    "--output-format",
    "--format",
    "output_format",
    type=click.Choice(FORMATS),
    default="full",
    show_default=True,
    help="Output format (`--format` is an alias). `summary` is Markdown for a CI job summary.",
)
@click.option(
    "--output-file",
    "-o",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the report to this file instead of standard output.",
)
@click.option(
    "--statistics",
    is_flag=True,
    help="Show how many findings each rule has instead of the findings.",
)
@click.option(
    "--add-noqa",
    is_flag=True,
    help="Add `# noqa: CODE` to every line with a finding, so that only new code is checked "
    "(exits 0 when every finding was silenced).",
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
    help="Read settings from this file for every path, instead of each file's nearest "
    "pyproject.toml or kllint.toml.",
)
@click.option(
    "--force-exclude",
    is_flag=True,
    help="Apply `exclude` and .gitignore to files named on the command line too "
    "(pre-commit names every changed file).",
)
@click.option(
    "--respect-gitignore/--no-respect-gitignore",
    default=None,
    help="Skip files that .gitignore ignores (default: on, or `respect-gitignore` in the config).",
)
@click.option(
    "--stdin-filename",
    default=None,
    metavar="PATH",
    help="With `-` as the path: the name of the code read from standard input "
    "(for its config, per-file-ignores and reports; `.ipynb` reads a notebook).",
)
@click.option(
    "--show-settings",
    is_flag=True,
    help="Print the settings the first path is checked with, and exit.",
)
@click.option(
    "--show-files",
    is_flag=True,
    help="Print the files that would be checked, and exit.",
)
@click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Colour the text output; `auto` colours a terminal unless NO_COLOR is set "
    "(FORCE_COLOR forces it).",
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
    help="Worker processes (default: one per idle CPU, as the work needs; a small tree gets one).",
)
@click.option(
    "--no-cache",
    is_flag=True,
    help="Analyse every file again; neither read nor write .kllint_cache/ (or $KLLINT_CACHE_DIR).",
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
def check(
    paths: tuple[Path, ...],
    select: tuple[str, ...],
    extend_select: tuple[str, ...],
    ignore: tuple[str, ...],
    output_format: str,
    output_file: Path | None,
    statistics: bool,
    add_noqa: bool,
    exit_zero: bool,
    config_path: Path | None,
    force_exclude: bool,
    respect_gitignore: bool | None,
    stdin_filename: str | None,
    show_settings: bool,
    show_files: bool,
    color: str,
    confirm: bool,
    jobs: int | None,
    no_cache: bool,
    fix: bool = False,
    unsafe_fixes: bool = False,
    diff: bool = False,
    show_fixes: bool = False,
) -> None:
    """Lint PATHS (default: the current directory; `-` reads standard input)
    for KL regularisers whose gradient is not the one intended.

    \b
    Exit status:
      0  no findings
      1  findings, or a file that could not be checked (a syntax error, not
         UTF-8); as in Ruff, the other files are still linted and reported
      2  a usage or configuration error, a missing path, or kllint crashing
    """
    if stdin_filename is not None and not paths:
        paths = (Path("-"),)  # as Ruff: a stdin filename alone means `-`
    from_stdin = Path("-") in paths
    if from_stdin and len(paths) > 1:
        _fail("error: `-` (standard input) cannot be combined with other paths")
    if from_stdin and add_noqa:
        _fail("error: --add-noqa edits files; it cannot be used with standard input")
    if from_stdin and (fix or diff):
        _fail("error: --fix and --diff edit files; they cannot be used with standard input")
    stdin_path = Path(stdin_filename) if stdin_filename else Path("-")
    targets = [stdin_path] if from_stdin else (list(paths) or [Path(".")])
    try:
        settings = load_settings(
            targets,
            config=config_path,
            select=_split(select) or None,
            extend_select=_split(extend_select),
            ignore=_split(ignore),
            force_exclude=force_exclude,
            respect_gitignore=respect_gitignore,
        )
        if show_settings:
            click.echo(describe_settings(settings.for_path(targets[0]), targets[0]), nl=False)
            return
        if show_files:
            if from_stdin:
                _fail("error: --show-files lists files on disk, not standard input")
            for path in _files(targets, settings):
                click.echo(display_path(path))
            return
        with _interruptible():
            if from_stdin:
                if force_exclude and settings.for_path(stdin_path).is_excluded(stdin_path):
                    return  # as Ruff: an excluded file named by an editor is not reported
                result = lint_source(sys.stdin.buffer.read(), str(stdin_path), settings)
            else:
                # --confirm needs each finding's KL site, which stays in this process.
                cache = None if no_cache or confirm else Cache.for_settings(settings)
                with _Progress(enabled=sys.stderr.isatty()):
                    result = lint_paths(
                        targets, settings, jobs=jobs, cache=cache, keep_sites=confirm
                    )
    except (ConfigError, MissingPathError) as err:
        _fail(f"error: {err}")
    if add_noqa:
        _add_noqa(result)
        return
    if confirm and result.findings:
        _confirm(result)
    fixable = result.findings and not from_stdin
    if fixable and (fix or diff or show_fixes or output_format in ("json", "sarif")):
        from kllint.fix.command import FixMode

        mode = FixMode(fix=fix, unsafe=unsafe_fixes, diff=diff, show=show_fixes, jobs=jobs)
        if mode.run(result, settings, output_format) is not None:
            raise click.exceptions.Exit(mode.exit_code or 0)

    use_color = _use_color(color, output_file)
    if statistics:
        report = reporters_text.statistics(result)
    else:
        report = render(result, output_format, color=use_color)
    if output_file is not None:
        try:
            output_file.write_text(report, encoding="utf-8")
        except OSError as err:
            _fail(f"error: cannot write {output_file}: {err.strerror or err}")
    else:
        try:
            # color=True when plain too: click would strip "ANSI" out of file names.
            click.echo(report, nl=False, color=True)
            sys.stdout.flush()
        except OSError as err:  # `> /dev/full`, a closed pipe
            with contextlib.suppress(OSError):
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - nothing more is written
            _fail(f"error: cannot write the report: {err.strerror or err}")
    for warning in result.warnings:
        click.echo(f"kllint: warning: {location(warning)}: {warning.message}", err=True)
    if result.files_checked == 0 and not result.errors:
        click.echo("kllint: warning: no Python files found", err=True)
    if result.internal_errors:
        click.echo(
            f"kllint: error: kllint crashed on {result.internal_errors} file(s) (reported as E998); "
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
    help="Also train a tabular policy with each estimator and save the curves "
    "(.png, .svg or .pdf by extension).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format of the table.",
)
def estimators(plot: str | None, output_format: str) -> None:
    """Print the exact verdicts of the canonical KL surrogates (needs torch)."""
    # Checked before importing anything, so a missing extra is one line and exit 2.
    _require("torch", "estimators", "confirm")
    if plot is not None:
        _require("matplotlib", "--plot", "plot")
    from kllint.harness import main_estimators

    raise SystemExit(main_estimators(plot, output_format))


@main.command("rules")
def list_rules() -> None:
    """List every rule: code, name and what fires it."""
    width = max(len(r.name) for r in RULES.values())
    for r in RULES.values():
        click.echo(f"{r.code}  {r.name:<{width}}  {r.summary}")


def _confirm(result: LintResult) -> None:
    """Run the torch harness on the findings (it fills ``Finding.confirmation``).
    Imported here: torch takes seconds to import and is an optional extra."""
    _require("torch", "--confirm", "confirm")
    from kllint.harness import confirm_findings

    try:
        confirm_findings(result.findings)
    except Exception as err:
        _fail(f"error: --confirm failed: {type(err).__name__}: {err} (a bug in kllint)")


def _require(module: str, feature: str, extra: str) -> None:
    """Fail with one line when an optional dependency is missing (or broken)."""
    try:
        importlib.import_module(module)
    except ImportError:
        _fail(f"{feature} needs {module}: pip install 'kllint[{extra}]'")


def _files(targets: list[Path], settings: Settings) -> list[Path]:
    seen: dict[str, Path] = {}
    for path in discover(targets, settings):
        seen.setdefault(os.path.abspath(path), path)
    return list(seen.values())


def _use_color(choice: str, output_file: Path | None) -> bool:
    """``--color``; ``auto`` follows https://no-color.org and FORCE_COLOR."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return output_file is None and sys.stdout.isatty()


def _add_noqa(result: LintResult) -> None:
    added, skipped = add_noqa_comments(result.findings)
    for path, reason in skipped:
        click.echo(f"kllint: warning: {path}: no noqa added ({reason})", err=True)
    click.echo(f"Added {added} noqa directive{'' if added == 1 else 's'}.")
    if result.errors:
        for error in result.errors:
            click.echo(f"{location(error)}: {error.code} {error.message}", err=True)
        raise click.exceptions.Exit(2 if result.internal_errors else 1)
    if skipped:
        raise click.exceptions.Exit(1)


class _Progress:
    """Elapsed time on stderr while a long run works, on a terminal only:
    nothing for the first seconds (most runs are done by then), and the
    line is erased at the end so the report starts clean."""

    DELAY_S = 2.0

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._shown = False

    def __enter__(self) -> _Progress:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._done.set()
            self._thread.join()
            if self._shown:
                sys.stderr.write("\r\033[K")
                sys.stderr.flush()

    def _run(self) -> None:
        start = time.monotonic()
        if self._done.wait(self.DELAY_S):
            return
        while not self._done.is_set():
            sys.stderr.write(f"\rkllint: checking... {time.monotonic() - start:.0f}s")
            sys.stderr.flush()
            self._shown = True
            self._done.wait(0.5)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C and SIGTERM stop the run at once: workers are killed on the way
    out (and die with this process anyway), exit 130 / 143, no traceback."""

    def terminate(signum: int, frame: object) -> None:
        raise _Terminated(signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except KeyboardInterrupt:
        click.echo("kllint: interrupted", err=True)
        raise click.exceptions.Exit(130) from None
    except _Terminated as stop:
        raise click.exceptions.Exit(128 + stop.signum) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Terminated(BaseException):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def _split(values: Sequence[str]) -> list[str]:
    """``--select KL001,KL002 --select KL005`` -> ``["KL001", "KL002", "KL005"]``."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _fail(message: str) -> NoReturn:
    click.echo(f"kllint: {message}", err=True)
    raise click.exceptions.Exit(2)
