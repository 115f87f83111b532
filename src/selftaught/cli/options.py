"""Command options generated from the config dataclasses: each option's default is the config
field's default and its help is the field's docstring, so both live once, in the config.

    @config_flags(SkillOptConfig, {"epochs": "epochs", "demo_sets_per_step": "demo_sets"},
                  into="skill_fields")
    def optimize_cmd(task: TaskOpt, skill_fields: dict[str, Any]) -> None:
        config = SkillOptConfig(**skill_fields, ...)

adds `--epochs` and `--demo-sets` to the command and hands their values to the command as one
dict keyed by field name. `config_file` over them adds `--config FILE` (a TOML or YAML file
whose keys are the fields, nested as the configs nest, read as the options' defaults) and
`--print-config` (the effective config, which a run folder keeps), and groups `--help` into
panels."""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import inspect
import json
import math
import re
import sys
import textwrap
import types
import typing
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

import typer

F = TypeVar("F", bound=Callable[..., Any])


_ARG = re.compile(r"^(?P<names>[a-z_][a-z0-9_]*(?: / [a-z_][a-z0-9_]*)*): (?P<text>.*)$")


def _args_section(doc: str) -> dict[str, str]:
    """A Google-style `Args:` section: `name: text` or `a / b: text`, continued when indented."""
    docs: dict[str, str] = {}
    lines = inspect.cleandoc(doc).splitlines()
    if "Args:" not in lines:
        return docs
    names: list[str] = []
    for line in lines[lines.index("Args:") + 1 :]:
        if not line.strip():
            continue
        if not line.startswith("    "):
            break
        m = _ARG.match(line.strip()) if not line.startswith("        ") else None
        if m:
            names = m["names"].split(" / ")
            for name in names:
                docs[name] = m["text"]
        else:
            for name in names:
                docs[name] += " " + line.strip()
    return docs


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's help: the string right under the field (attribute docstring), else its entry
    in the class docstring's `Args:` section; bases included."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        docs.update(_args_section(klass.__doc__ or ""))
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = cast(ast.ClassDef, tree.body[0]).body
        for prev, node in zip(body, body[1:], strict=False):
            if (
                isinstance(prev, ast.AnnAssign)
                and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def field_help(cls: type, name: str) -> str:
    doc = field_docs(cls).get(name)
    if not doc:
        raise TypeError(f"{cls.__name__}.{name} has no docstring to serve as its --help")
    return doc


def field_default(cls: type, name: str) -> Any:
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"{cls.__name__}.{name} has no default")


def _is_str_tuple(hint: Any) -> bool:
    """`tuple[str, ...]` (or it or None): a flag that takes a comma-separated list."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    return typing.get_origin(hint) is tuple and typing.get_args(hint)[:1] == (str,)


def _option_type(hint: Any) -> Any:
    """What typer can parse: a Literal of strings becomes str (the config validates it), a
    tuple of strings a comma-separated string, a union holding str (e.g. a model spec or a
    ChatModel) its string form."""
    if _is_str_tuple(hint):
        return str | None
    if typing.get_origin(hint) is Literal:
        return type(typing.get_args(hint)[0])
    args = typing.get_args(hint)
    if args and type(None) in args and any(typing.get_origin(a) is Literal for a in args):
        return str | None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if type(None) not in args:
            return args[0]  # e.g. `str | list[str]`: the flag takes the string form
        if str in args and len(args) > 2:
            return str | None  # e.g. `str | ChatModel | None`: a spec string
    return hint


def _from_flag(hint: Any, value: Any) -> Any:
    """A flag's value as the field takes it (a comma-separated list as a tuple)."""
    if _is_str_tuple(hint) and isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip()) or None
    return value


def config_option(
    cls: type, name: str, *decls: str, help_suffix: str = "", optional: bool = False
) -> Any:
    """`Annotated[type, typer.Option(...)]` for one config field (default set by the caller;
    `optional`: the option may be left unset, None)."""
    hint = typing.get_type_hints(cls)[name]
    help_text = field_help(cls, name) + (f" {help_suffix}" if help_suffix else "")
    kind = _option_type(hint)
    if optional and type(None) not in typing.get_args(kind):
        kind = kind | None
    return Annotated[kind, typer.Option(*decls, help=help_text)]


FieldFlags = Mapping[str, "str | tuple[str, ...]"] | Sequence[str]


def flag_default(cls: type, field: str, defaults: Any) -> Any:
    """The flag's default: from `defaults` (a mapping by field, or a config instance) when it
    names the field, else the class's own."""
    if isinstance(defaults, Mapping):
        return defaults[field] if field in defaults else field_default(cls, field)
    return getattr(defaults, field) if defaults is not None else field_default(cls, field)


def config_flags(
    cls: type,
    fields: FieldFlags,
    *,
    into: str,
    defaults: Any = None,
    section: str = "",
) -> Callable[[F], F]:
    """Add one option per config field to a command; the command receives their values as one
    dict `into`, keyed by field name. `fields` maps a field to its option's parameter name, or
    to (parameter name, short flag, ...), e.g. `{"samples_per_prompt": ("samples_per_prompt",
    "-k")}`. Defaults are the class's, or those `defaults` gives (a config instance, e.g. a
    night's own SkillOpt settings, or a mapping by field name: a None there leaves the option
    unset, for a command that decides later). In a config file (`config_file`) each option's
    key is its field's name, in the table `section` (dotted, e.g. "training.gate"; "": the
    file's top level)."""
    named = dict(fields) if isinstance(fields, Mapping) else {f: f for f in fields}
    names = {f: (v if isinstance(v, str) else v[0]) for f, v in named.items()}
    shorts = {f: (() if isinstance(v, str) else tuple(v[1:])) for f, v in named.items()}
    hints = typing.get_type_hints(cls)
    table = tuple(section.split(".")) if section else ()

    def option(field: str, param: str) -> inspect.Parameter:
        default = flag_default(cls, field, defaults)
        decls = ("--" + param.replace("_", "-"), *shorts[field]) if shorts[field] else ()
        annotation = config_option(cls, field, *decls, optional=default is None)
        return inspect.Parameter(
            param, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
        )

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name != into]
        added = [option(field, param) for field, param in names.items()]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            chosen = {
                field: _from_flag(hints[field], kwargs.pop(param)) for field, param in names.items()
            }
            return fn(*args, **{into: chosen}, **kwargs)

        positional = [p for p in params if p.kind != inspect.Parameter.KEYWORD_ONLY]
        keyword = [p for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY]
        keys = {**config_keys(fn), **{param: (*table, f) for f, param in names.items()}}
        _expose(wrapper, sig.replace(parameters=[*positional, *keyword, *added]), keys)
        return cast(F, wrapper)

    return decorate


def _expose(wrapper: Callable[..., Any], sig: inspect.Signature, keys: ConfigKeys) -> None:
    """What typer reads off a command built here: this signature (not the wrapped function's)
    and each option's key in a config file."""
    wrapper.__dict__["__signature__"] = sig
    wrapper.__dict__[_KEYS] = keys
    wrapper.__annotations__ = {p.name: p.annotation for p in sig.parameters.values()}
    del wrapper.__dict__["__wrapped__"]  # typer must read this signature, not the command's own


# ---- config files: `--config FILE` and `--print-config` ---------------------------------

ConfigKeys = dict[str, tuple[str, ...]]  # parameter -> its key path in a config file
Renamed = Mapping[tuple[str, ...], tuple[str, ...]]  # an old key path -> its new one
_KEYS = "__config_keys__"
SUFFIXES = (".toml", ".yaml", ".yml")
CONFIG_FILE = "config.toml"  # the effective config a run folder keeps


def _is_secret(param: str) -> bool:
    """An API key or a client's key: read from the environment, never written into a file."""
    return param == "api_key" or param.endswith("_key")


def config_keys(fn: Callable[..., Any]) -> ConfigKeys:
    """The config-file keys `config_flags` gave a command's options (the rest: their names)."""
    keys: ConfigKeys = getattr(fn, _KEYS, {})
    return dict(keys)


@dataclasses.dataclass(frozen=True)
class EffectiveConfig:
    """What `--print-config` prints: the settings of this run (flags over the file over the
    defaults) as a config file that reproduces it."""

    text: str

    def keep(self, folder: str | Path, name: str = CONFIG_FILE) -> Path:
        """Write it into the run's folder (as `config.toml`, atomically); its path."""
        from selftaught.runs import atomic_write_text

        path = Path(folder) / name
        atomic_write_text(path, self.text)
        return path


def config_file(
    *,
    keys: Mapping[str, str] | None = None,
    panels: Mapping[str, Sequence[str]] | None = None,
    exclude: Sequence[str] = (),
    into: str | None = None,
    renamed: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """Add `--config FILE` and `--print-config` to a command (put it right under the command's
    decorators, over its `config_flags`). A file's keys are the options' config keys: a
    `config_flags` option's field in its section, else the option's own name, or the dotted
    key `keys` gives it (e.g. `{"gate_metric": "training.gate.metric"}`). The file's values
    are the options' defaults, so a flag on the command line overrides the file. `panels`:
    --help panel -> the options in it. `exclude`: options that are actions, not settings (they
    and hidden options are no keys). `into`: the parameter that receives the
    `EffectiveConfig`, for the command to keep in its run folder. `renamed`: an old dotted key
    -> the key it is now (a field renamed), read as the new one with a DeprecationWarning so
    an older file still runs; `--print-config` writes the new one."""

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name != into]
        in_panel = {name: panel for panel, names in (panels or {}).items() for name in names}
        unknown = set(in_panel) - {p.name for p in params}
        if unknown:
            raise TypeError(f"{fn.__name__}: no option {sorted(unknown)} to put in a panel")
        params = [_in_panel(p, in_panel[p.name]) if p.name in in_panel else p for p in params]
        # --help (and a printed config) in the panels' order; typer passes every one by name
        order = {panel: i for i, panel in enumerate(panels or {}, 1)}
        params = sorted(params, key=lambda p: order.get(in_panel.get(p.name, ""), 0))
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
        table = _key_table(params, config_keys(fn), keys or {}, exclude)
        _check_keys(fn.__name__, table)
        old = {tuple(k.split(".")): tuple(v.split(".")) for k, v in (renamed or {}).items()}
        missing = [".".join(v) for v in old.values() if v not in table.values()]
        if missing:
            raise TypeError(f"{fn.__name__}: renamed to {missing}, which no option has as its key")
        params += _file_options(table, old)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("config")  # read already: its values are the options' defaults
            effective = EffectiveConfig(render_config(_values(table, kwargs)))
            if kwargs.pop("print_config"):
                typer.echo(effective.text, nl=False)
                raise typer.Exit()  # printed, not run
            return fn(*args, **kwargs, **({into: effective} if into else {}))

        _expose(wrapper, sig.replace(parameters=params), table)
        return cast(F, wrapper)

    return decorate


def _key_table(
    params: Sequence[inspect.Parameter],
    generated: ConfigKeys,
    keys: Mapping[str, str],
    exclude: Sequence[str],
) -> ConfigKeys:
    """Each option's key in a config file: the dotted key given, else its field's (from
    `config_flags`), else its name; actions and hidden options have none."""
    table: ConfigKeys = {}
    for p in params:
        if p.name in exclude or _hidden(p) or not isinstance(_info(p), typer.models.OptionInfo):
            continue
        given = keys.get(p.name)
        table[p.name] = tuple(given.split(".")) if given else generated.get(p.name, (p.name,))
    return table


def _info(p: inspect.Parameter) -> Any:
    """The typer option or argument info of a parameter (None: e.g. a typer.Context)."""
    metadata = getattr(p.annotation, "__metadata__", ())
    return next((m for m in metadata if isinstance(m, typer.models.ParameterInfo)), None)


def _hidden(p: inspect.Parameter) -> bool:
    return bool(getattr(_info(p), "hidden", False))


def _in_panel(p: inspect.Parameter, panel: str) -> inspect.Parameter:
    """The parameter with its option shown in this --help panel."""
    info = copy.copy(_info(p))
    if info is None:
        raise TypeError(f"{p.name} is not a typer option: it cannot go in a panel")
    info.rich_help_panel = panel
    base = typing.get_args(p.annotation)[0]
    return p.replace(annotation=Annotated[base, info])


def _check_keys(command: str, table: ConfigKeys) -> None:
    """Each key names one option, and no key is both a value and a table."""
    seen: dict[tuple[str, ...], str] = {}
    for param, path in table.items():
        if path in seen:
            raise TypeError(f"{command}: {param} and {seen[path]} share the key {'.'.join(path)}")
        seen[path] = param
    tables = {path[:i] for path in seen for i in range(1, len(path))}
    clash = tables & set(seen)
    if clash:
        raise TypeError(f"{command}: {'.'.join(min(clash))} is both a key and a table")


def _file_options(table: ConfigKeys, renamed: Renamed) -> list[inspect.Parameter]:
    """`--config FILE` (read first, eagerly) and `--print-config`."""

    def load(ctx: typer.Context, value: Path | None) -> Path | None:
        if value is not None and not ctx.resilient_parsing:
            found = read_config(value, table, ctx, renamed)
            ctx.default_map = {**(ctx.default_map or {}), **found}
        return value

    config = Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A TOML or YAML file of settings: its keys are the configs' fields, nested as "
            "the configs nest (`--print-config` writes one); flags given here override it.",
            is_eager=True,
            callback=load,
            metavar="FILE",
        ),
    ]
    printed = Annotated[
        bool,
        typer.Option(
            "--print-config",
            help="Print the effective config (TOML: flags over --config over defaults), which "
            "reproduces this run with --config, and exit.",
        ),
    ]
    keyword = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter("config", keyword, default=None, annotation=config),
        inspect.Parameter("print_config", keyword, default=False, annotation=printed),
    ]


def read_config(
    path: Path, table: ConfigKeys, ctx: Any = None, renamed: Renamed | None = None
) -> dict[str, Any]:
    """A config file's settings by option name; unknown keys and unreadable files refused with
    the file, the key and the valid keys named; an old key `renamed` maps read as its new one
    (a DeprecationWarning), one set under both names refused."""
    from selftaught.errors import ConfigError, read_text

    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"--config {path}: a config file is .toml, .yaml or .yml")
    data = _parse(path, read_text(path, "config file"))
    by_key = {key: param for param, key in table.items()}
    renamed = renamed or {}
    known = {**by_key, **{old: by_key[new] for old, new in renamed.items()}}
    found: dict[str, Any] = {}
    for key, value in _leaves(path, data, (), known, by_key):
        param = known[key]
        if param in found:
            raise ConfigError(f"{path}: {'.'.join(key)} is set twice (under its old name too)")
        if key in renamed:
            new = ".".join(renamed[key])
            warnings.warn(f"{path}: {'.'.join(key)} is now {new}", DeprecationWarning, stacklevel=2)
        found[param] = _as_default(value, _click_param(ctx, param))
    return found


def _parse(path: Path, text: str) -> Any:
    from selftaught.errors import ConfigError

    if path.suffix.lower() == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # the `tomli` dependency on Python 3.10
            import tomli as tomllib
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path} is not valid TOML: {err}") from None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}, not a mapping of settings")
    return data


def _leaves(
    path: Path,
    data: Mapping[Any, Any],
    at: tuple[str, ...],
    by_key: Mapping[tuple[str, ...], str],
    valid: Collection[tuple[str, ...]],
) -> typing.Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every setting in the file, each checked against the known keys
    (`by_key`, old names included); a refusal names the `valid` ones."""
    from selftaught.errors import ConfigError

    for name, value in data.items():
        key = (*at, str(name))
        if key in by_key:
            if isinstance(value, Mapping):
                raise ConfigError(f"{path}: {'.'.join(key)} takes a value, not a table")
            yield key, value
        elif isinstance(value, Mapping) and any(k[: len(key)] == key for k in by_key):
            yield from _leaves(path, value, key, by_key, valid)
        else:
            here = sorted({k[len(at)] for k in valid if k[: len(at)] == at and len(k) > len(at)})
            where = f"in [{'.'.join(at)}] " if at else ""
            raise ConfigError(
                f"{path}: unknown key {'.'.join(key)!r}; the valid keys {where}are "
                + ", ".join(here)
            )


def _click_param(ctx: Any, name: str) -> Any:
    return next(
        (p for p in getattr(getattr(ctx, "command", None), "params", []) if p.name == name), None
    )


def _as_default(value: Any, param: Any) -> Any:
    """A file's value as the option takes it: a list for a repeatable option, a list as the
    comma-separated text of an option that takes one."""
    multiple = bool(getattr(param, "multiple", False))
    if multiple:
        return list(value) if isinstance(value, (list, tuple)) else [value]
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return value


_URL_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]*@")


def _values(table: ConfigKeys, kwargs: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    """The settings a config file holds, by key path: keys, a URL's password (e.g. `--log
    postgresql://...`, which the environment holds) and unset values left out."""
    return {
        key: value
        for param, key in table.items()
        if (value := kwargs.get(param)) is not None
        and not _is_secret(param)
        and not (isinstance(value, str) and _URL_PASSWORD.search(value))
    }


def render_config(values: Mapping[tuple[str, ...], Any]) -> str:
    """Settings by key path as TOML: top-level keys first, then one table each."""
    tables: dict[tuple[str, ...], list[str]] = {(): []}
    for key, value in values.items():
        tables.setdefault(key[:-1], []).append(f"{key[-1]} = {_toml(value)}")
    lines = tables.pop(())
    first = {name[0]: i for i, name in reversed(list(enumerate(tables)))}
    for name, body in sorted(tables.items(), key=lambda kv: (first[kv[0][0]], kv[0])):
        lines += ["", f"[{'.'.join(name)}]", *body]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            repr(value)
            if math.isfinite(value)
            else ("nan" if value != value else "inf" if value > 0 else "-inf")
        )
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Path):
        value = str(value.absolute())
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
