"""Command options generated from the config dataclasses: each option's default is the config
field's default and its help is the field's docstring, so both live once, in the config.

    @config_flags(SkillOptConfig, {"epochs": "epochs", "demo_sets_per_step": "demo_sets"},
                  into="skill_fields")
    def optimize_cmd(task: TaskOpt, skill_fields: dict[str, Any]) -> None:
        config = SkillOptConfig(**skill_fields, ...)

adds `--epochs` and `--demo-sets` to the command and hands their values to the command as one
dict keyed by field name."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

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
        body = tree.body[0].body  # type: ignore[attr-defined]
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
    f = cls.__dataclass_fields__[name]  # type: ignore[attr-defined]
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
) -> Callable[[F], F]:
    """Add one option per config field to a command; the command receives their values as one
    dict `into`, keyed by field name. `fields` maps a field to its option's parameter name, or
    to (parameter name, short flag, ...), e.g. `{"samples_per_prompt": ("samples_per_prompt",
    "-k")}`. Defaults are the class's, or those `defaults` gives (a config instance, e.g. a
    night's own SkillOpt settings, or a mapping by field name: a None there leaves the option
    unset, for a command that decides later)."""
    named = dict(fields) if isinstance(fields, Mapping) else {f: f for f in fields}
    names = {f: (v if isinstance(v, str) else v[0]) for f, v in named.items()}
    shorts = {f: (() if isinstance(v, str) else tuple(v[1:])) for f, v in named.items()}
    hints = typing.get_type_hints(cls)

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
        new_sig = sig.replace(parameters=[*positional, *keyword, *added])
        wrapper.__signature__ = new_sig  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in new_sig.parameters.values()}
        del wrapper.__wrapped__  # typer must read this signature, not the command's own
        return wrapper  # type: ignore[return-value]

    return decorate
