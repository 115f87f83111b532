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


_ARG = re.compile(r"^(?P<names>[a-z_]+(?: / [a-z_]+)*): (?P<text>.*)$")


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


def _option_type(hint: Any) -> Any:
    """What typer can parse: a Literal of strings becomes str (the config validates it)."""
    if typing.get_origin(hint) is Literal:
        return type(typing.get_args(hint)[0])
    args = typing.get_args(hint)
    if args and type(None) in args and any(typing.get_origin(a) is Literal for a in args):
        return str | None
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) not in args:
        return args[0]  # e.g. `str | list[str]`: the flag takes the string form
    return hint


def config_option(cls: type, name: str, *decls: str, help_suffix: str = "") -> Any:
    """`Annotated[type, typer.Option(...)]` for one config field (default set by the caller)."""
    hint = typing.get_type_hints(cls)[name]
    help_text = field_help(cls, name) + (f" {help_suffix}" if help_suffix else "")
    return Annotated[_option_type(hint), typer.Option(*decls, help=help_text)]


def config_flags(
    cls: type,
    fields: Mapping[str, str] | Sequence[str],
    *,
    into: str,
    defaults: Any = None,
) -> Callable[[F], F]:
    """Add one option per config field (field name -> option parameter name) to a command;
    the command receives their values as one dict `into`, keyed by field name. Defaults are
    the class's, or those of the `defaults` instance (e.g. a night's own SkillOpt settings)."""
    names = dict(fields) if isinstance(fields, Mapping) else {f: f for f in fields}

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name != into]
        added = [
            inspect.Parameter(
                param,
                inspect.Parameter.KEYWORD_ONLY,
                default=getattr(defaults, field) if defaults else field_default(cls, field),
                annotation=config_option(cls, field),
            )
            for field, param in names.items()
        ]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            chosen = {field: kwargs.pop(param) for field, param in names.items()}
            return fn(*args, **{into: chosen}, **kwargs)

        positional = [p for p in params if p.kind != inspect.Parameter.KEYWORD_ONLY]
        keyword = [p for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY]
        new_sig = sig.replace(parameters=[*positional, *keyword, *added])
        wrapper.__signature__ = new_sig  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in new_sig.parameters.values()}
        del wrapper.__wrapped__  # typer must read this signature, not the command's own
        return wrapper  # type: ignore[return-value]

    return decorate
