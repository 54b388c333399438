"""Flags declared once, on the config dataclasses, and everything derived from that declaration.

A config field declared with `flag(...)` carries its command-line name, help, the spellings vLLM and
SGLang use for it, and how its text is read; its default is the field's. From that one declaration
come each service's argparse arguments (`add_flags`), the config built from parsed arguments
(`config_kwargs`), the command line `turnout serve` writes for a child (`to_argv`), and the flags
tables of the docs.

Where a value comes from, lowest first: the field's default, `--config FILE.yaml` (vLLM's: keys are
flag names without the dashes, `-` or `_`, any accepted spelling), `TURNOUT_<FLAG>` environment
variables (the canonical flag's name, upper case, `-` as `_`), then the command line. `FlagParser`
does the layering; every Turnout command's parser is one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

ENV_PREFIX = "TURNOUT_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class FlagSpec:
    """How a config field appears on the command line.

    `name`: the canonical spelling (default `--field-name`); `aliases`: other spellings with the same
    meaning (vLLM's, SGLang's). For a bool field the flag sets True and `negations` set False.
    `parse`: text -> value (default: from the field's type); raising `argparse.ArgumentTypeError`
    there refuses the value at parse time (exit 2). `choices`: the accepted values, after `parse`.
    `append`: a tuple field filled by repeating the flag (else `--flag A B ...`, or one word that
    `parse` reads into the whole tuple when the field has a `parse`)."""

    help: str
    name: str | None = None
    aliases: tuple[str, ...] = ()
    negations: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None
    append: bool = False


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
        return " ".join(str(v) for v in value) or "none"
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
        items = [str(v) for v in value]
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


# -- the parser ---------------------------------------------------------------------


class _Layered(list[Any]):
    """A list that came from a config file or the environment: the command line replaces it."""


class AppendAction(argparse.Action):
    """A repeatable flag (`--api-key A --api-key B`). A list from a lower layer is replaced, not
    extended: the command line wins over the file and the environment."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items = getattr(namespace, self.dest, None)
        items = [] if items is None or isinstance(items, _Layered) or items is self.default else list(items)
        items.append(values)
        setattr(namespace, self.dest, items)


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser that also reads `--config FILE.yaml` and `TURNOUT_*` variables (file < env <
    command line), checks required flags after all three, and reports an error in one line."""

    def __init__(self, *args: Any, environ: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.environ = environ
        self.required_flags: dict[str, str] = {}
        # dest of a positional -> dest of the flag it also spells (`turnout serve MODEL` / `--model`)
        self.positional_of: dict[str, str] = {}
        self._source = ""
        self.add_argument(
            "--config",
            metavar="FILE",
            help="YAML file of flags (keys: flag names without dashes); the environment and the command line "
            f"win over it. Each flag can also be set as ${ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}MAX_MODEL_LEN)",
        )

    def error(self, message: str) -> NoReturn:
        """One line on stderr and exit 2 (argparse would print the whole usage first)."""
        source = f"{self._source}: " if self._source else ""
        self.exit(2, f"{self.prog}: error: {source}{message}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        namespace = namespace or argparse.Namespace()
        if "-h" in argv or "--help" in argv:
            return super().parse_known_args(argv, namespace)
        config = _config_path(argv)
        if config is not None:
            self._apply_layer(self._file_layer(config), namespace, f"config file {config}")
        self._apply_layer(self._env_layer(), namespace, "environment")
        layered = {dest: getattr(namespace, dest, None) for dest in self.positional_of.values()}
        _, extras = super().parse_known_args(argv, namespace)  # fills `namespace` in place
        for positional, dest in self.positional_of.items():
            given = vars(namespace).pop(positional, None)
            if given is None:
                continue
            flagged = getattr(namespace, dest, None)
            if flagged not in (None, layered[dest], given):
                self.error(f"{given} and --{dest.replace('_', '-')} {flagged} disagree; give one")
            setattr(namespace, dest, given)
        missing = [name for dest, name in self.required_flags.items() if getattr(namespace, dest, None) is None]
        if missing:
            self.error(f"the following arguments are required: {', '.join(missing)}")
        return namespace, extras

    # A layer: (action, values as text) pairs. Switches are set directly (a false value must turn a
    # switch off, which has no spelling when the switch has no negation); the rest is parsed as words.
    def _apply_layer(
        self, layer: list[tuple[argparse.Action, list[str]]], namespace: argparse.Namespace, source: str
    ) -> None:
        if not layer:
            return
        self._source = source
        try:
            words: list[str] = []
            for action, items in layer:
                spelling = action.option_strings[0]
                if action.nargs == 0:
                    on = _truth(items[-1])
                    if on is None:
                        self.error(f"{spelling}: expected true or false, got {items[-1]!r}")
                    setattr(namespace, action.dest, action.const if on else not action.const)
                elif isinstance(action, AppendAction):
                    words += [w for item in items for w in (spelling, item)]
                else:
                    words += [spelling, *items]
            super().parse_known_args(words, namespace)
        finally:
            self._source = ""
        for dest, value in vars(namespace).items():
            if isinstance(value, list) and not isinstance(value, _Layered):
                setattr(namespace, dest, _Layered(value))

    def _options(self) -> dict[str, argparse.Action]:
        return {
            spelling: action
            for action in self._actions
            for spelling in action.option_strings
            if spelling.startswith("--") and action.dest not in ("help", "config")
        }

    def _file_layer(self, path: str) -> list[tuple[argparse.Action, list[str]]]:
        self._source = f"config file {path}"
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            self.error(f"cannot read it: {exc}")
        if not isinstance(data, dict):
            self.error("expected a mapping of flag names to values")
        options = self._options()
        layer = []
        for key, value in data.items():
            action = options.get("--" + str(key).replace("_", "-"))
            if action is None:
                self.error(f"unknown key {key!r} (no flag --{str(key).replace('_', '-')})")
            if value is None:
                continue
            items = value if isinstance(value, list) else [value]
            layer.append((action, [json.dumps(v) if isinstance(v, dict) else _yaml_word(v) for v in items]))
        self._source = ""
        return layer

    def _env_layer(self) -> list[tuple[argparse.Action, list[str]]]:
        environ = os.environ if self.environ is None else self.environ
        layer = []
        for action in self._actions:
            if not action.option_strings or action.dest in ("help", "config"):
                continue
            text = environ.get(env_name(action.option_strings[0]))
            if text is None or text == "":
                continue
            if action.nargs == 0:
                items = [text]
            elif isinstance(action, AppendAction):
                items = [line for line in text.split("\n") if line]  # one a line, as TURNOUT_API_KEY
            elif action.nargs in ("+", "*"):
                items = shlex.split(text)
            else:
                items = [text]
            layer.append((action, items))
        return layer


def env_name(spelling: str) -> str:
    """`--max-model-len` -> `TURNOUT_MAX_MODEL_LEN`."""
    return ENV_PREFIX + spelling.lstrip("-").upper().replace("-", "_")


def _truth(text: str) -> bool | None:
    lowered = text.strip().lower()
    return True if lowered in _TRUE else False if lowered in _FALSE else None


def _yaml_word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _config_path(argv: list[str]) -> str | None:
    """The --config of a command line, read before the rest is parsed (its values are the base)."""
    path = None
    for i, word in enumerate(argv):
        if word == "--":
            break
        if word == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif word.startswith("--config="):
            path = word.split("=", 1)[1]
    return path
