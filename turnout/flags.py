"""Flags declared once, on the config dataclasses, and everything derived from that declaration.

A config field declared with `flag(...)` carries its command-line name, help, the spellings vLLM and
SGLang use for it, and how its text is read; its default is the field's. From that one declaration
come each service's argparse arguments (`add_flags`), the config built from parsed arguments
(`config_kwargs`), the command line `turnout serve` writes for a child (`to_argv`), and the flags
tables of the docs (flags_doc.py). Every Turnout command's parser is a `FlagParser`
(flag_parser.py), which also reads them from `--config FILE.yaml` and `TURNOUT_*` variables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnout.flag_parser import AppendAction, FlagParser


@dataclass(frozen=True)
class FlagSpec:
    """How a config field appears on the command line.

    `name`: the canonical spelling (default `--field-name`); `aliases`: other spellings with the same
    meaning (vLLM's, SGLang's). For a bool field the flag sets True and `negations` set False.
    `parse`: text -> value (default: from the field's type); raising `argparse.ArgumentTypeError`
    there refuses the value at parse time (exit 2). `choices`: the accepted values, after `parse`.
    `append`: a tuple field filled by repeating the flag (else `--flag A B ...`, or one word that
    `parse` reads into the whole tuple when the field has a `parse`). `item` / `show_item`: for a
    tuple field, how one word is read into an element and an element written back as one word
    (default: the element is the word)."""

    help: str
    name: str | None = None
    aliases: tuple[str, ...] = ()
    negations: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None
    append: bool = False
    item: Callable[[str], Any] | None = None
    show_item: Callable[[Any], str] | None = None


def flag(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    default_factory: Any = dataclasses.MISSING,
    name: str | None = None,
    aliases: Sequence[str] = (),
    negations: Sequence[str] = (),
    metavar: str | None = None,
    choices: Sequence[str] | None = None,
    parse: Callable[[str], Any] | None = None,
    append: bool = False,
    item: Callable[[str], Any] | None = None,
    show_item: Callable[[Any], str] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Any:
    """A dataclass field that is also a flag (see FlagSpec); no default: the flag is required."""
    spec = FlagSpec(
        help=help,
        name=name,
        aliases=tuple(aliases),
        negations=tuple(negations),
        metavar=metavar,
        choices=tuple(choices) if choices is not None else None,
        parse=parse,
        append=append,
        item=item,
        show_item=show_item,
    )
    meta = {**(metadata or {}), "flag": spec}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Declared:
    """One flag field of a config class, with its type resolved."""

    field: str
    spec: FlagSpec
    kind: type  # int, float, str, bool, Path, dict or tuple (of str)
    default: Any
    required: bool

    @property
    def flag(self) -> str:
        return self.spec.name or "--" + self.field.replace("_", "-")

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.flag, *self.spec.aliases)

    @property
    def metavar(self) -> str:
        if self.spec.metavar is not None:
            return self.spec.metavar
        if self.spec.choices is not None:
            return "{" + ",".join(self.spec.choices) + "}"
        return _METAVARS.get(self.kind, "VALUE")

    def read(self, text: str) -> Any:
        """One command-line word as this field's value (one element, for a tuple)."""
        if self.spec.parse is not None:
            return self.spec.parse(text)
        if self.kind is tuple and self.spec.item is not None:
            return self.spec.item(text)
        if self.kind is dict:
            return json_object(text)
        return (str if self.kind is tuple else self.kind)(text)


def declared(cls: type) -> list[Declared]:
    """The flag fields of a config dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("flag")
        if spec is None:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (f.default if f.default_factory is dataclasses.MISSING else f.default_factory())
        out.append(Declared(f.name, spec, _base_type(hints[f.name]), default, required))
    return out


def _base_type(hint: Any) -> type:
    """`int | None` -> int, `tuple[str, ...]` -> tuple, `dict[str, Any]` -> dict."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    origin = typing.get_origin(hint)
    return typing.cast(type, origin or hint)


def shown(value: Any) -> str:
    """A default as help texts and docs show it."""
    if value is None or value == "":
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value) or "none"  # (defaults of tuple flags are plain words)
    if isinstance(value, dict):
        return json.dumps(value) if value else "none"
    return str(value)


def help_text(d: Declared, services: Sequence[str] = ()) -> str:
    text = d.spec.help
    if "(default" not in text and not d.required:
        text += f" (default: {shown(d.default)})"
    if services:
        text = f"{', '.join(services)}: {text}"
    return text.replace("%", "%%")


def add_flags(
    parser: argparse._ActionsContainer,
    cls: type,
    *,
    exclude: Iterable[str] = (),
    services: Sequence[str] = (),
) -> list[Declared]:
    """An argument per flag field of `cls` (except `exclude`), defaulting to the field's default.
    `services`: the services the flag is meant for, named in its help (`turnout serve`)."""
    skipped = set(exclude)
    added = [d for d in declared(cls) if d.field not in skipped]
    for d in added:
        add_argument(parser, d, services)
    return added


def add_argument(parser: argparse._ActionsContainer, d: Declared, services: Sequence[str] = ()) -> None:
    # Required fields are checked after the layers are read (FlagParser), so a config file or the
    # environment may give them.
    if d.required and isinstance(parser, FlagParser):
        parser.required_flags[d.field] = d.flag
    common: dict[str, Any] = {"dest": d.field, "default": d.default, "help": help_text(d, services)}
    if d.kind is bool:
        parser.add_argument(*d.spellings, action="store_const", const=True, **common)
        if d.spec.negations:
            parser.add_argument(
                *d.spec.negations, action="store_const", const=False, dest=d.field, help=f"turn {d.flag} off"
            )
        return
    common["metavar"] = d.metavar
    if d.spec.choices is not None:
        common["choices"] = d.spec.choices
    if d.kind is tuple and d.spec.parse is None:
        action = AppendAction if d.spec.append else "store"
        nargs = None if d.spec.append else "+"
        parser.add_argument(*d.spellings, type=d.read, action=action, nargs=nargs, **common)
    else:
        parser.add_argument(*d.spellings, type=d.read, **common)


_METAVARS: dict[type, str] = {int: "N", float: "NUM", str: "TEXT", Path: "PATH", dict: "JSON"}


def config_kwargs(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `cls(...)` the parsed flags give (lists as tuples)."""
    out = {}
    for d in declared(cls):
        value = getattr(args, d.field)
        out[d.field] = tuple(value) if isinstance(value, list) else value
    return out


def to_argv(d: Declared, value: Any) -> list[str]:
    """The canonical command-line words that give `value` (what `turnout serve` writes for a child)."""
    if d.kind is bool:
        if value is None:
            return []
        if value:
            return [d.flag]
        if not d.spec.negations:
            raise ValueError(f"{d.flag} has no spelling that turns it off")
        return [d.spec.negations[0]]
    if value is None:
        return []
    if d.kind is tuple and d.spec.parse is not None:  # one word holds the list
        return [d.flag, json.dumps(list(value))]
    if d.kind is tuple:
        items = [d.spec.show_item(v) if d.spec.show_item is not None else str(v) for v in value]
        return [w for item in items for w in (d.flag, item)] if d.spec.append else [d.flag, *items]
    if d.kind is dict:
        return [d.flag, json.dumps(value)]
    return [d.flag, str(value)]


# -- value readers -----------------------------------------------------------------


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text}")
    return value


def spelled(canonical: Mapping[str, str]) -> Callable[[str], str]:
    """A reader that maps other projects' spellings of a value to ours (others pass unchanged, for
    the choices check to name)."""

    def read(text: str) -> str:
        return canonical.get(text, text)

    return read


def only(accepted: Sequence[Any], kind: Callable[[str], Any], why: str) -> Callable[[str], Any]:
    """A reader that refuses, at parse time, every value but `accepted`, saying why."""

    def read(text: str) -> Any:
        value = kind(text)
        if value not in accepted:
            raise argparse.ArgumentTypeError(f"{text}: {why}")
        return value

    return read
