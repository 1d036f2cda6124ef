"""Selectors: where the value that picks an estimator comes from, and how a
branch condition is labelled.

A selector is a string or flag a branch tests (``kl_type == "low_var_kl"``).
Its value comes, strongest evidence first, from a literal, a keyword default,
an Enum or constants class member, the default of a typed config class
(``config: TrainerConfig``), or the one default the package gives the setting
(argparse, dataclass fields, YAML; see ``Project.config_defaults``). A branch
condition is shown in messages only when it can select an estimator.
Functions over CST nodes and already-evaluated values."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import libcst as cst

from kllint.analysis import roles
from kllint.analysis.module import ENVIRONMENT_READS, ClassInfo, ModuleInfo, dotted_name
from kllint.analysis.project import Project
from kllint.analysis.syntax import descendants, full_code, named_params
from kllint.analysis.values import HIDDEN, Py, Unknown

# A name with one of these words, compared with a string, selects an estimator.
SELECTOR_WORDS = frozenset(
    {"kind", "estimator", "estimate", "variant", "approx", "approximation", "kl"}
)
# A condition mentioning one of these is about the KL itself.
KL_CONDITION_PARTS = ("kl", "estimator", "penalty", "divergence")
# ``config.x``, ``args.x``: an object whose attributes are settings.
CONFIG_WORDS = frozenset(
    {
        "config",
        "cfg",
        "args",
        "opt",
        "opts",
        "hparams",
        "params",
        "conf",
        "settings",
        "options",
        "training",
        "hyperparams",
    }
)


def is_selector_literal(expr: cst.BaseExpression) -> bool:
    """A keyword default that picks a branch for a function analysed on its
    own: a literal, a module constant (``cfg: dict = DEFAULT_CFG``), an
    Enum member (``kl_type: KLType = KLType.K1``) or a settings object built
    from literals (``kl: SequenceKL = SequenceKL()``, ``KLConfig(kind="k3")``)."""
    if isinstance(expr, (cst.SimpleString, cst.Integer)):
        return True
    if isinstance(expr, cst.Call):
        return (
            isinstance(expr.func, cst.Name)
            and expr.func.value[:1].isupper()
            and all(
                not a.star and isinstance(a.value, (cst.SimpleString, cst.Integer, cst.Float))
                for a in expr.args
            )
        )
    if isinstance(expr, cst.Name):
        return expr.value in ("True", "False") or (expr.value.isupper() and len(expr.value) > 1)
    return (
        isinstance(expr, cst.Attribute)
        and isinstance(expr.value, cst.Name)
        and expr.value.value[:1].isupper()
        and expr.attr.value.isupper()
    )


def cli_option_default(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """``kl_estimator: str = typer.Option("k1", help=...)``: the literal a
    command-line option takes by default (typer's ``Option``/``Argument``,
    given first or as ``default=``), else None."""
    if not (
        isinstance(expr, cst.Call)
        and (dotted_name(expr.func) or "").rsplit(".", 1)[-1] in ("Option", "Argument")
    ):
        return None
    given = [a.value for a in expr.args if a.keyword is None and not a.star][:1] or [
        a.value for a in expr.args if a.keyword is not None and a.keyword.value == "default"
    ]
    if given and isinstance(given[0], (cst.SimpleString, cst.Integer, cst.Float, cst.Name)):
        return given[0]
    return None


def selects_estimator(
    subject: cst.CSTNode, compared: cst.CSTNode, text: str, *, in_helper: bool
) -> bool:
    """Whether a condition can select an estimator: it mentions the KL, or
    compares a selector (``kind``, ``estimator``, any string test inside a
    helper) with a string."""
    lowered = text.lower()
    if any(word in lowered for word in KL_CONDITION_PARTS):
        return True
    if in_helper and _equals_a_number(compared):
        # ``if alpha == 1.0:`` picks the reverse KL among a family of divergences.
        return True
    # A string literal is spelled with a quote: most conditions have none.
    if ("'" not in text and '"' not in text) or not any(
        isinstance(n, cst.SimpleString) for n in descendants(compared)
    ):
        return False
    if in_helper:
        return True
    names = {
        w for n in descendants(subject) if isinstance(n, cst.Name) for w in roles.words(n.value)
    }
    return bool(names & SELECTOR_WORDS)


def _equals_a_number(test: cst.CSTNode) -> bool:
    return (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, (cst.Equal, cst.NotEqual))
        and isinstance(test.comparisons[0].comparator, (cst.Float, cst.Integer))
    )


def condition_label(test: cst.BaseExpression, *, in_helper: bool) -> str:
    """A branch condition, shown in messages only when it can select an
    estimator. A ``loss_type == "cispo"`` in the trainer around it is not shown."""
    key = (id(test), in_helper)
    known = _LABELS.get(key)
    if known is None:
        text = full_code(test)
        label = text if selects_estimator(test, test, text, in_helper=in_helper) else HIDDEN + text
        # The node is kept with its label: its id is not reused while it is here.
        known = _LABELS[key] = (test, label)
    return known[1]


# A helper's conditions are labelled again at every call that inlines it,
# in every file that calls it. Entries keep their (small) condition nodes, so
# an id is never reused while it is a key.
_LABELS: dict[tuple[int, bool], tuple[cst.BaseExpression, str]] = {}


# Settings read with a default written at the read: ``os.environ.get("KL_ESTIMATOR",
# "k3")``, ``os.getenv(...)`` (the key is the first argument), and
# ``OmegaConf.select(cfg, "algorithm.kl.type", default="kl")`` (the second).
_SETTING_READS = dict.fromkeys(ENVIRONMENT_READS, (0, "the environment"))


def read_with_a_default(call: cst.Call) -> Py | None:
    """The literal default of a setting read from the environment or a config
    with its default at the read: what runs when the setting is not given."""
    read = _SETTING_READS.get(dotted_name(call.func) or "")
    if read is None:
        return None
    index, where = read
    given = [a for a in call.args if a.keyword is None]
    default = given[index + 1].value if len(given) > index + 1 else None
    default = next(
        (a.value for a in call.args if a.keyword and a.keyword.value == "default"), default
    )
    key = given[index].value if len(given) > index else None
    if not isinstance(key, cst.SimpleString):
        return None
    if not isinstance(default, (cst.SimpleString, cst.Integer, cst.Float)):
        return None
    return Py(default.evaluated_value, source=f"`{key.evaluated_value!s}` unset in {where}")


def default_note(subject: cst.BaseExpression | str, default: Py) -> str:
    """How a resolved config default is explained in a finding."""
    shown = subject if isinstance(subject, str) else full_code(subject)
    return f"{shown} = {default.value!r} (default from {default.source})"


def class_constant(module: ModuleInfo, class_name: str, attr: str) -> Py | None:
    """``KLEstimator.K3``: an Enum member or class constant stands for its value."""
    info = module.classes.get(class_name)
    value = _class_literal(info, attr) if info is not None else None
    return Py(value) if value is not None else None


def class_setting(project: Project, cls: ClassInfo, module: ModuleInfo, attr: str) -> Py | None:
    """A string a class body (the class's or a base's of the project) gives
    ``attr``, when no line of the class assigns ``self.attr``. Asked of
    every ``self.x`` read: only for a name that can choose an estimator
    (``DIVERGENCE``, ``kl_type``), not ``self.model``; any name a class
    keyword sets through ``__init_subclass__`` (``level="sequence"``)."""
    keyword = subclass_keyword(project, cls, module, attr)
    if keyword is not None:
        return keyword
    if not (attr.isupper() or names_a_selector(attr)):
        return None
    for current, where in project.lineage(cls, module):
        value = _class_literal(current, attr)
        if value is not None:
            if not isinstance(value, str) or _self_assignments(module, cls, attr):
                return None
            line = where.line_of_class(current.name)
            return Py(value, source=f"`{current.name}.{attr}` ({where.path.name}:{line})")
    return None


def class_flag(project: Project, cls: ClassInfo, module: ModuleInfo, attr: str) -> Py | None:
    """``use_kl_loss = False`` in a class body (the class's or the nearest
    base's that sets it): a constant of the class, not a setting, when no
    method of the lineage assigns ``self.use_kl_loss``. A subclass turns the
    term on by setting it again in its own body. An annotated field is an
    object's setting (a dataclass's), left open."""
    if attr not in cls.flags:  # every ``self.x`` read asks
        cls.flags[attr] = _class_flag(project, cls, module, attr)
    flag = cls.flags[attr]
    return None if flag is None else Py(flag)


def _class_flag(project: Project, cls: ClassInfo, module: ModuleInfo, attr: str) -> bool | None:
    lineage = list(project.lineage(cls, module))
    for current, where in lineage:
        if not where.may_assign_in_a_body(attr):
            continue
        field = next((f for f in current.fields if f.name == attr), None)
        if field is None:
            continue
        if field.annotated or field.flag_default is None:
            return None
        if any(_self_assignments(where, c, attr) for c, where in lineage):
            return None
        return field.flag_default
    return None


def subclass_keyword(project: Project, cls: ClassInfo, module: ModuleInfo, attr: str) -> Py | None:
    """``class SequenceK3(K3, level="sequence")`` under a base whose
    ``__init_subclass__(cls, level="token")`` sets ``cls.level = level``:
    the keyword the class, or its nearest base, is defined with. A class
    defined without it is left to the class bodies (the hook may set the
    attribute only when given one)."""
    parameter = _subclass_hooks(project, cls, module).get(attr)
    if parameter is None:
        return None
    for current, where in project.lineage(cls, module):
        for given in current.node.keywords:
            if given.keyword is None or given.keyword.value != parameter:
                continue
            value = _literal_node(given.value)
            if value is None:
                return None
            line = where.line_of_class(current.name)
            return Py(value, source=f"`class {current.name}` ({where.path.name}:{line})")
    return None


def _subclass_hooks(project: Project, cls: ClassInfo, module: ModuleInfo) -> dict[str, str]:
    """What the ``__init_subclass__`` of ``cls``'s lineage sets from its
    parameters: each class attribute with the parameter it is set from."""
    if cls.subclass_hooks is None:
        cls.subclass_hooks = {}
        for current, _ in project.lineage(cls, module):
            if "__init_subclass__" not in current.methods:
                continue
            hook = current.methods["__init_subclass__"]
            parameters = {p.name.value for p in named_params(hook)}
            for node in descendants(hook.body):
                if (
                    isinstance(node, cst.Assign)
                    and len(node.targets) == 1
                    and isinstance(target := node.targets[0].target, cst.Attribute)
                    and isinstance(target.value, cst.Name)
                    and target.value.value == "cls"
                    and isinstance(node.value, cst.Name)
                    and node.value.value in parameters
                ):
                    cls.subclass_hooks.setdefault(target.attr.value, node.value.value)
    return cls.subclass_hooks


def names_a_selector(attr: str) -> bool:
    """``kl_estimator``, ``kl_type``, ``divergence``: a setting named like
    one that chooses an estimator."""
    lowered = attr.lower()
    return bool(set(roles.words(attr)) & SELECTOR_WORDS) or any(
        part in lowered for part in KL_CONDITION_PARTS
    )


def _class_literal(cls: ClassInfo, attr: str) -> str | int | None:
    """The literal a class body gives ``attr`` (an Enum member's value, a
    field's ``field(default=...)``)."""
    return next(
        (
            value
            for f in cls.fields
            if f.name == attr
            for value in (f.literal, f.field_default)
            if value is not None
        ),
        None,
    )


def field_flag(cls: ClassInfo, attr: str) -> bool | None:
    """``use_legacy_kl: bool = False`` in the body of a settings class: the
    flag's default on an object built from it (``args=GRPOConfig()``)."""
    return next((f.flag_default for f in cls.fields if f.name == attr), None)


def _literal_node(node: cst.BaseExpression | None, *, ints: bool = True) -> str | int | None:
    """A string (or integer) literal's value, else None."""
    if isinstance(node, cst.SimpleString):
        text = node.evaluated_value
        return text if isinstance(text, str) else None
    if ints and isinstance(node, cst.Integer):
        return int(node.value, 0)
    return None


def config_default(
    project: Project,
    fs_path: Path,
    module: ModuleInfo,
    function: cst.FunctionDef | None,
    cls: ClassInfo | None,
    base: Unknown,
    attr: str,
    *,
    index: bool = False,
    flags: bool = False,
) -> Py | None:
    """``self.config.kl_loss_type`` and the like: the one default the
    project gives that setting, if there is exactly one. An ``index`` (a
    setting that picks an item, ``stack[args.kl_estimator]``) may be an int;
    with ``flags``, a boolean's default is given too (see ``Unknown.default_flag``)."""
    if base.call or base.module is not None:
        return None
    if base.names == ("self",) and cls is not None:
        given = init_default(module, cls, attr, index=index, project=project)
        if given is not None:
            return given
    # A nested settings object read by the chain written
    # (``algo = self.cfg.algorithm``; ``algo.kl_estimator_type``), not by
    # the name it was also given.
    written = _chain(base)
    typed = typed_default(project, module, function, cls, written, attr, index=index)
    if typed is not None:
        # A YAML file of the package that sets the key is the run's
        # configuration: it overrides the class's default.
        yaml = {
            repr(d.value): d
            for d in project.config_defaults(fs_path, attr)
            if d.kind == "yaml" and isinstance(d.value, type(typed.value))
        }
        if len(yaml) == 1:
            (override,) = yaml.values()
            return Py(override.value, source=override.source)
        return typed
    config_at = next(
        (i for i, n in enumerate(base.names) if any(w in CONFIG_WORDS for w in roles.words(n))),
        None,
    )
    if config_at is None:
        if not (
            base.names == ("self",) and cls is not None and _passed_in(project, module, cls, attr)
        ):
            return None
        # ``self.kl_estimator`` from ``__init__``'s parameter, which every
        # caller sets (``PolicyLoss(kl_estimator=args.kl_estimator)``): the
        # package's one default for that setting, as for a config object.
        config_at = 0
    # ``args.algo.kl.estimator`` from a dotted option ``--algo.kl.estimator``
    # (nested after parsing), or ``getattr(args, "algo.kl.estimator")``.
    nested = ".".join((*base.names[config_at + 1 :], attr))
    defaults = project.config_defaults(fs_path, nested) if "." in nested else []
    defaults = defaults or project.config_defaults(fs_path, attr)
    # ``args.x`` is an argparse namespace; ``config.x`` a config class or YAML.
    # A YAML file that sets the key is the run's configuration: it overrides
    # the parser's defaults (``parser.set_defaults(**yaml.safe_load(f))``) as
    # it overrides a class's.
    from_args = any("args" in roles.words(n) for n in base.names)
    preferred = [d for d in defaults if d.kind == "yaml"] or [
        d for d in defaults if (d.kind == "argparse") == from_args
    ]
    defaults = preferred or defaults
    kinds = (str, int) if index else (str,)
    if flags and defaults and all(isinstance(d.value, bool) for d in defaults):
        # A feature flag stays open (a default of ``use_kl_loss: false`` must
        # not hide the path users turn on); its default is returned to be
        # remembered: of two findings on one expression, the one on the path
        # the defaults take is reported.
        if len({d.value for d in defaults}) == 1:
            return Py(defaults[0].value, source=defaults[0].source)
        return None
    if not all(isinstance(d.value, kinds) and not isinstance(d.value, bool) for d in defaults):
        # Feature flags and numbers stay open: a default of ``use_kl_loss:
        # false`` must not hide the code path users turn on.
        return None
    values = {repr(d.value) for d in defaults}
    if len(values) != 1:
        return None
    sources = sorted({d.source for d in defaults})
    return Py(
        defaults[0].value, source="; ".join(sources[:2]) + (" ..." if len(sources) > 2 else "")
    )


def _chain(base: Unknown) -> tuple[str, ...]:
    """The attribute chain a settings object is read by: the chain written
    (``algo = self.cfg.algorithm``; ``algo.kl_estimator_type``), not the name
    it was also given, and an alias's names replaced by what it stands for
    (``cfg = self.config``; ``cfg.kl_loss``: ``self.config.kl_loss``)."""
    written = tuple(base.text.split(".")) if _DOTTED.fullmatch(base.text) else ()
    if len(base.names) > 2 and len(written) >= 2 and base.names[: len(written)] == written:
        return written
    if len(written) >= 2 and written[0] in base.names[1:]:
        alias = base.names.index(written[0], 1)
        if base.names[alias + 1 :] == written[1:]:
            return (*base.names[:alias], *written[1:])
    return base.names


def package_default(project: Project, fs_path: Path, key: str) -> Py | None:
    """The one string default the package gives a setting named ``key``
    (``kl_estimator: str = "k3"`` in a dataclass, ``--kl_estimator``), for a
    constructor parameter every caller passes on from the settings."""
    if not names_a_selector(key):
        return None
    defaults = project.config_defaults(fs_path, key)
    values = {d.value for d in defaults}
    if len(values) != 1 or not all(isinstance(d.value, str) for d in defaults):
        return None
    return Py(defaults[0].value, source=defaults[0].source)


def init_default(
    module: ModuleInfo,
    cls: ClassInfo,
    attr: str,
    *,
    index: bool = False,
    project: Project | None = None,
) -> Py | None:
    """``self.kl_loss_type`` set once, in ``__init__``, from a parameter
    with a default (``kl_loss_type="low_var_kl"``): that default, as for a
    config field. Not when any other line of the file assigns the attribute,
    nor when the package builds the class passing that parameter
    (``PolicyLoss(kl_estimator=args.kl_estimator)``): what runs is then the
    caller's setting."""
    if not assigned_once(module, cls, attr):
        return None  # read from the class's text: ``__init__`` is not parsed for it
    init = cls.methods.get("__init__")
    parameter = _init_parameter(cls, attr)
    if init is None or parameter is None:
        return None
    default = next(
        (
            p.default
            for p in [*init.params.params, *init.params.kwonly_params]
            if p.name.value == parameter
        ),
        None,
    )
    # ``kl_estimator: Literal[0, 1, 2, 3] = 2``: a choice among values, so an
    # int is a selector even where the value is handed on before it indexes.
    choices = _is_literal_type(annotation_of(init, parameter))
    literal = _literal_node(default, ints=index or choices)
    if literal is None:
        # ``kl_estimator: KLEstimator = KLEstimator.K2``: the member's value.
        literal = _member_value(module, default, project)
    if isinstance(literal, (str, int)) and not (
        project is not None and project.builds_passing(module.path, cls.name, parameter)
    ):
        line = module.line_of_class(cls.name)
        return Py(literal, source=f"`{cls.name}.__init__` ({module.path.name}:{line})")
    return None


def _member_value(
    module: ModuleInfo, node: cst.BaseExpression | None, project: Project | None
) -> str | int | None:
    """``KLEstimator.K2``, an Enum of this module or imported from the
    project: the member's literal value."""
    if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)):
        return None
    name = node.value.value
    found = (
        project.class_named(name, module)
        if project is not None
        else ((module.classes[name], module) if name in module.classes else None)
    )
    return _class_literal(found[0], node.attr.value) if found is not None else None


def assigned_once(module: ModuleInfo, cls: ClassInfo, attr: str) -> bool:
    """No line of the class but one assigns ``self.attr``."""
    return _self_assignments(module, cls, attr) == 1


def assigned_on_branches(module: ModuleInfo, cls: ClassInfo, attr: str) -> bool:
    """Several lines of the class assign ``self.attr``, each to a call
    (``self.kl_reduce = functools.partial(...)`` on each branch of an ``if``)."""
    return _self_assignments(module, cls, attr) > 1 and attr in _self_attributes(module, cls)[2]


def builds_object(module: ModuleInfo, cls: ClassInfo, attr: str) -> bool:
    """Some line of the class sets ``self.attr = Name(...)``, a class's
    object (read from its text: ``__init__`` need not be parsed to learn
    that it builds none)."""
    return attr in _self_attributes(module, cls)[1]


def holds_a_parameter(module: ModuleInfo, cls: ClassInfo, attr: str) -> bool:
    """Some line of the class sets ``self.attr = name``, a bare name that
    the class's text annotates with a class (a constructor's parameter,
    ``self.kl_regularizer = kl_regularizer`` of ``kl_regularizer:
    KLRegularizer``)."""
    key = (module.path, cls.name)
    known = _HELD_NAMES.get(key)
    if known is None:
        text = _class_text(module, cls)
        typed = set(_TYPED_PARAMETER.findall(text))
        known = _HELD_NAMES[key] = frozenset(
            held for held, name in _HELD.findall(text) if name in typed
        )
    return attr in known


def _self_assignments(module: ModuleInfo, cls: ClassInfo, attr: str) -> int:
    """How many lines of the class assign ``self.attr``."""
    return _self_attributes(module, cls)[0].get(attr, 0)


def _self_attributes(
    module: ModuleInfo, cls: ClassInfo
) -> tuple[Counter[str], frozenset[str], frozenset[str]]:
    """How often the class's text assigns each ``self.x``, which it sets to
    a class's object, and which to a call of a function: one scan of the
    class per process (a pattern per attribute asked about was compiled anew
    for each, beyond ``re``'s cache)."""
    key = (module.path, cls.name)
    known = _SELF_ATTRIBUTES.get(key)
    if known is None:
        text = _ANNOTATION.sub(r"\1 =", _class_text(module, cls))
        assigned = Counter(_ASSIGNED.findall(text))
        for targets in _TUPLE_TARGETS.findall(text):
            assigned.update(re.findall(r"\bself\.(\w+)", targets))
        known = _SELF_ATTRIBUTES[key] = (
            assigned,
            frozenset(_BUILT.findall(text)),
            frozenset(_CALLED.findall(text)),
        )
    return known


def maximises(module: ModuleInfo, cls: ClassInfo | None) -> bool:
    """Whether the class (or, outside a class, the file) builds its optimizer
    with ``maximize=True``: what it backpropagates is then climbed, an
    objective rather than a loss."""
    text = _class_text(module, cls) if cls is not None else module.source
    if "maximize" in text and _MAXIMIZE.search(text) is not None:
        return True
    # ``self.optimizer = build_optimizer(model, args)``, the builder a function
    # of the module: every optimizer the file builds outside a class climbs.
    source = module.source
    return (
        cls is not None
        and "maximize" in source
        and any(not _in_a_class(source, m.start()) for m in _MAXIMIZE.finditer(source))
    )


def _in_a_class(source: str, position: int) -> bool:
    """Whether ``position`` lies in a top-level class: the nearest line above it
    that starts at column 0 with code opens one."""
    for line in reversed(source[:position].split("\n")):
        if re.match(r"[^\s#]", line):
            return line.startswith("class ")
    return False


_MAXIMIZE = re.compile(r"\bmaximize\s*=\s*True\b")
_ASSIGNED = re.compile(r"self\.(\w+)\s*(?:[-+*/]?=)(?!=)")
# ``self.kl_estimator, _, level = spec.partition("@")``: each ``self.x`` of the
# targets is assigned by the line.
_TUPLE_TARGETS = re.compile(
    r"(?m)^[ \t]*\(?((?:[\w.]+[ \t]*,[ \t]*)+[\w.]+)[ \t]*,?[ \t]*\)?[ \t]*=(?!=)"
)
# ``self.kl = KLLoss(...)``, or a class picked from a registry and built
# (``self.kl_fn = KL_MODULES[cfg.kl_estimator]()``, ``KL_LOSSES[lc["kl"]]()``),
# or by a classmethod factory (``KLPenalty.from_config(args)``), or a list of
# objects (``self.callbacks = [PolicyGradientCallback(), KLCallback(beta)]``).
_BUILT = re.compile(
    r"self\.(\w+)\s*=\s*[(\[]?\s*_*[A-Z]\w*(?:\.\w+)?\s*(?:\[(?:[^\[\]\n]|\[[^\]\n]*\])*\]\s*)?\("
)
# ``self.kl_reduce = functools.partial(masked_sum, ...)``: set to a call's result.
_CALLED = re.compile(r"self\.(\w+)\s*=\s*[\w.]+\(")
# ``self.kl_regularizer = kl_regularizer``: an attribute set to a bare name, and
# ``kl_regularizer: KLRegularizer``, a name annotated with a class.
_HELD = re.compile(r"^[ \t]+self\.(\w+)\s*(?::[^=\n]+)?=\s*([A-Za-z_]\w*)[ \t]*$", re.M)
_TYPED_PARAMETER = re.compile(r"\b(\w+)\s*:\s*_*[A-Z]\w*\s*[,)=]")
_HELD_NAMES: dict[tuple[Path, str], frozenset[str]] = {}
# ``self.shaper: RewardShaper = KLShaper(...)`` reads as ``self.shaper = KLShaper(...)``.
_ANNOTATION = re.compile(r"(?m)^([ \t]*self\.\w+)[ \t]*:[^=\n]+=(?!=)")
_SELF_ATTRIBUTES: dict[tuple[Path, str], tuple[Counter[str], frozenset[str], frozenset[str]]] = {}


def _passed_in(project: Project, module: ModuleInfo, cls: ClassInfo, attr: str) -> bool:
    """``__init__`` sets ``self.attr`` from one of its parameters, and the
    package builds the class passing that parameter by keyword. Asked only
    of a setting named like a KL selector (``kl_estimator``, ``kl_type``):
    every ``self.x`` of a model is looked up, and the package's constructor
    calls are scanned only when one can matter."""
    if not names_a_selector(attr):
        return False
    parameter = _init_parameter(cls, attr)
    return parameter is not None and project.builds_passing(module.path, cls.name, parameter)


def _init_parameter(cls: ClassInfo, attr: str) -> str | None:
    """The parameter ``__init__`` sets ``self.attr`` from, if any."""
    init = cls.methods.get("__init__")
    if init is None or not isinstance(init.body, cst.IndentedBlock):
        return None
    # Every ``self.x`` read in a method asks: ``__init__`` is read once.
    known = _INIT_ASSIGNMENTS.get(id(init))
    if known is None or known[0] is not init:
        table: dict[str, str] = {}
        for statement in init.body.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if (
                    isinstance(small, cst.Assign)
                    and len(small.targets) == 1
                    and isinstance(small.value, cst.Name)
                ):
                    target = dotted_name(small.targets[0].target)
                    if target is not None:
                        table.setdefault(target, small.value.value)  # the first one counts
        known = _INIT_ASSIGNMENTS[id(init)] = (init, table)
    return known[1].get(f"self.{attr}")


# Keyed by the id of ``__init__``'s node, which is kept with its table so
# that the id is not reused while it is a key.
_INIT_ASSIGNMENTS: dict[int, tuple[cst.FunctionDef, dict[str, str]]] = {}


def validates_defaults(module: ModuleInfo, cls: ClassInfo) -> bool:
    """A pydantic model that runs its validators on the fields' defaults."""
    return "validate_default=True" in _class_text(module, cls)


def _class_text(module: ModuleInfo, cls: ClassInfo) -> str:
    """The lines of a top-level class: from its header to the next line that
    starts at column 0 with code (the whole file if it cannot be placed)."""
    key = (module.path, cls.name)
    if key not in _CLASS_TEXTS:
        _CLASS_TEXTS[key] = _class_lines(module, cls)
    return _CLASS_TEXTS[key]


_CLASS_TEXTS: dict[tuple[Path, str], str] = {}


def _class_lines(module: ModuleInfo, cls: ClassInfo) -> str:
    start = module.line_of_class(cls.name)
    if start == 0:
        return module.source
    lines = module.source.split("\n")
    end = start
    while end < len(lines) and not re.match(r"[^\s#]", lines[end]):
        end += 1
    return "\n".join(lines[start - 1 : end])


_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def typed_default(
    project: Project,
    module: ModuleInfo,
    function: cst.FunctionDef | None,
    cls: ClassInfo | None,
    names: tuple[str, ...],
    attr: str,
    *,
    index: bool = False,
) -> Py | None:
    """``config.x`` where ``config: TrainerConfig`` is a parameter (or
    ``self.args.x`` where ``__init__`` takes ``args: TrainerConfig``): the
    default that class gives ``x``, the most specific evidence there is."""
    found = _config_class(project, module, function, cls, names)
    if found is None:
        return None
    config_class, where = found
    overridden = dict(_factory_overrides(project, module, function, cls, names)).get(attr)
    literal = overridden if overridden is not None else _field_default(config_class, attr)
    # An Enum-typed field (``kl_type: KLType = KLType.K3_RTG``) chooses among
    # members: an ``IntEnum`` member's int is a selector's value.
    choices = literal is None and any(
        f.name == attr and f.annotated and f.member is not None for f in config_class.fields
    )
    if literal is None:
        literal = _named_default(project, where, config_class, attr)
    choices = choices or any(f.name == attr and f.choices for f in config_class.fields)
    if literal is None or (isinstance(literal, int) and not (index or choices)):
        return None
    line = where.line_of_class(config_class.name)
    return Py(literal, source=f"`{config_class.name}` ({where.path.name}:{line})")


def record_field_default(
    project: Project, module: ModuleInfo, cls: ClassInfo, attr: str
) -> Py | None:
    """The default a record class (a dataclass) gives its field ``attr``: a
    string, or an Enum member's value, that picks as a selector does."""
    literal = _field_default(cls, attr)
    if literal is None:
        literal = _named_default(project, module, cls, attr)
    if literal is None:
        return None
    line = module.line_of_class(cls.name)
    return Py(literal, source=f"`{cls.name}` ({module.path.name}:{line})")


def number_setting(
    project: Project,
    module: ModuleInfo,
    function: cst.FunctionDef | None,
    cls: ClassInfo | None,
    names: tuple[str, ...],
    attr: str,
) -> tuple[float, str] | None:
    """``loss_config.kl_tau`` where ``loss_config: LossConfig`` gives
    ``kl_tau: float = 0.05``: a number the run is configured with, so a
    constant of the loss (a coefficient), not a path for its gradient. So is
    an int that chooses nothing (``micro_batch: int = 4``, not
    ``kl_estimator: Literal[0, 1, 2] = 2``). Returns the default and where
    it is given; None when the setting is no such number."""
    found = _config_class(project, module, function, cls, names)
    if found is None:
        return None
    config_class, where = found
    for f in config_class.fields:
        if (
            f.name == attr
            and f.annotated
            and f.number is not None
            and (
                f.float_default or (f.int_default and not f.choices and not names_a_selector(attr))
            )
        ):
            line = where.line_of_class(config_class.name)
            return f.number, f"`{config_class.name}` ({where.path.name}:{line})"
    return None


def settings_class(
    project: Project,
    module: ModuleInfo,
    function: cst.FunctionDef | None,
    cls: ClassInfo | None,
    base: Unknown,
) -> tuple[ClassInfo, ModuleInfo] | None:
    """The config class whose object ``base`` is (``config: KLGRPOConfig``,
    ``self.args`` of an ``args: KLGRPOConfig``), as ``config_default`` finds it."""
    if base.call or base.module is not None:
        return None
    written = _chain(base)
    return _config_class(project, module, function, cls, written)


def declaring_class(
    module: ModuleInfo, attr: str, value: str | int | bool
) -> tuple[ClassInfo, ModuleInfo] | None:
    """The one class of the module whose field ``attr`` defaults to
    ``value``: where a setting read through a chain kllint does not type
    (``config.loss.kl.estimator`` handed down) is declared."""
    found = [
        cls
        for cls in module.classes.values()
        if ("__post_init__" in cls.methods or "validator" in _class_text(module, cls))
        and _field_default(cls, attr) == value
    ]
    return (found[0], module) if len(found) == 1 else None


def field_literals(cls: ClassInfo) -> dict[str, str | int]:
    """The literal defaults of a config class's fields."""
    return {
        f.name: d
        for f in cls.fields
        if f.annotated and (d := _field_default(cls, f.name)) is not None
    }


def _config_class(
    project: Project,
    module: ModuleInfo,
    function: cst.FunctionDef | None,
    cls: ClassInfo | None,
    names: tuple[str, ...],
) -> tuple[ClassInfo, ModuleInfo] | None:
    """The class a config object is annotated with: ``config: TrainerConfig``
    as a parameter, or ``args: TrainerConfig`` in ``__init__`` for ``self.args``."""
    annotation: cst.BaseExpression | None = None
    nested: tuple[str, ...] = ()
    if names and names[0] != "self" and function is not None:
        annotation = annotation_of(function, names[0])
        nested = names[1:]
    elif len(names) >= 2 and names[0] == "self" and cls is not None:
        # ``__init__`` of the class, or the one it inherits (an abstract base
        # that keeps ``self.cfg``), read where it is written.
        init = project.method(cls, module, "__init__")
        if init is not None:
            annotation = annotation_of(init.node, names[1])
            module = init.module
        nested = names[2:]
    class_name = dotted_name(_optional(annotation)) if annotation is not None else None
    if class_name is None:
        return None
    found = project.class_named(class_name, module)
    # ``self.cfg.algorithm.kl_estimator_type``: a settings object held in a
    # field of another (``algorithm: AlgorithmConfig = field(default_factory=...)``).
    for name in nested:
        if found is None:
            return None
        inner = next((f.config_class for f in found[0].fields if f.name == name), None)
        found = project.class_named(inner, found[1]) if inner is not None else None
    return found


def _factory_overrides(
    project: Project,
    module: ModuleInfo,
    function: cst.FunctionDef | None,
    cls: ClassInfo | None,
    names: tuple[str, ...],
) -> tuple[tuple[str, str | int], ...]:
    """``cfg.kl_loss`` held in ``kl_loss: KLLossConfig = field(default_factory=
    lambda: KLLossConfig(kl_loss_type="low_var_kl"))``: the settings the
    factory builds the nested object with."""
    if len(names) < 2:
        return ()
    outer = _config_class(project, module, function, cls, names[:-1])
    if outer is None:
        return ()
    return next((f.overrides for f in outer[0].fields if f.name == names[-1]), ())


def _field_default(cls: ClassInfo, attr: str) -> str | int | None:
    """``attr: str = "k3"`` or ``attr: str = field(default="k3")`` in a class body."""
    for found in cls.fields:
        if found.name == attr and found.annotated:
            value = found.literal if found.literal is not None else found.field_default
            if value is not None:
                return value
    return None


def _named_default(
    project: Project, module: ModuleInfo, cls: ClassInfo, attr: str
) -> str | int | None:
    """A default given by name: an Enum member (``attr: KLEstimator =
    KLEstimator.LOW_VAR``), which stands for its value (``"low_var_kl"``),
    or a module constant (``= KL_LOW_VAR_IS``, with ``KL_LOW_VAR_IS = 2``)."""
    for found in cls.fields:
        if not (found.name == attr and found.annotated):
            continue
        if found.member is not None:
            enum = project.class_named(found.member[0], module)
            return _class_literal(enum[0], found.member[1]) if enum is not None else None
        if found.constant is not None and found.constant in module.constants:
            return _literal_node(module.constants[found.constant])
    return None


def _optional(annotation: cst.BaseExpression) -> cst.BaseExpression:
    """``PPOConfig`` of ``PPOConfig | None`` and ``Optional[PPOConfig]``."""
    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        sides = [annotation.left, annotation.right]
        named = [s for s in sides if not (isinstance(s, cst.Name) and s.value == "None")]
        return named[0] if len(named) == 1 else annotation
    if (
        isinstance(annotation, cst.Subscript)
        and (dotted_name(annotation.value) or "").endswith("Optional")
        and len(annotation.slice) == 1
        and isinstance(annotation.slice[0].slice, cst.Index)
    ):
        return annotation.slice[0].slice.value
    return annotation


def _is_literal_type(annotation: cst.BaseExpression | None) -> bool:
    return isinstance(annotation, cst.Subscript) and (dotted_name(annotation.value) or "").endswith(
        "Literal"
    )


def annotation_of(fn: cst.FunctionDef, name: str) -> cst.BaseExpression | None:
    """The annotation of ``fn``'s parameter ``name`` (``config: PPOConfig``)."""
    for param in named_params(fn):
        if param.name.value == name and param.annotation is not None:
            return param.annotation.annotation
    return None
