"""Bounded work per request: n / best_of, stop strings and structured-output constraints are refused
over their limits, with a message naming the field, the limit and the flag that raises it, before
anything is allocated or compiled."""

from __future__ import annotations

import json
import time

import pytest

from services.engine.config import EngineConfig, limit_flag, request_limit_fields
from services.engine.grammar.constraint import Constraint
from services.engine.grammar.constraint_limits import ConstraintLimits, check_constraint, json_depth
from services.engine.sampling_validation import Limits, resolve
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2

LIMITS = Limits(prompt_len=10, max_model_len=100, vocab_size=50)


def resolve_params(limits: Limits = LIMITS, /, **params: object) -> object:
    return resolve(common_pb2.SamplingParams(**params), common_pb2.SamplingParams(), limits)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n": 4294967295}, r"n must be at most 128 \(the server's --max-n\), got 4294967295"),
        ({"n": 129}, r"n must be at most 128 \(the server's --max-n\), got 129"),
        ({"n": 2, "best_of": 4294967295}, r"best_of must be at most 128 \(the server's --max-n\)"),
        ({"best_of": 200}, r"best_of must be at most 128"),
    ],
)
def test_n_and_best_of_are_bounded(params: dict[str, object], message: str) -> None:
    started = time.monotonic()
    with pytest.raises(InvalidArgument, match=message):
        resolve_params(**params)
    assert time.monotonic() - started < 5  # refused before anything scales with n


def test_n_at_the_limit_is_accepted_and_the_limit_is_configurable() -> None:
    assert resolve_params(n=128).best_of == 128  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument, match="n must be at most 4 "):
        resolve_params(Limits(prompt_len=10, max_model_len=100, vocab_size=50, max_n=4), n=5)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"stop": ["ok", ""]}, r"stop\[1\] is empty"),
        ({"stop_regex": [""]}, r"stop_regex\[0\] is empty"),
        ({"stop": ["x"] * 40, "stop_regex": ["y"] * 25}, r"hold 65 entries .* at most 64 .*--max-stop-sequences"),
        ({"stop": ["x" * 1025]}, r"stop\[0\] is 1025 characters long; at most 1024 .*--max-stop-sequence-length"),
        ({"stop_regex": ["a", "b" * 5000]}, r"stop_regex\[1\] is 5000 characters .*--max-stop-sequence-length"),
    ],
)
def test_stop_strings_are_checked(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        resolve_params(**params)


def test_stop_strings_within_the_limits_pass() -> None:
    resolve_params(stop=["x"] * 32 + ["y" * 1024], stop_regex=["[0-9]"] * 31)


def deep_array_schema(depth: int) -> str:
    """An array of arrays ... of strings: `depth` JSON objects nested."""
    return '{"type": "array", "items": ' * (depth - 1) + '{"type": "string"}' + "}" * (depth - 1)


def check(kind: str, text: str, **limits: int) -> None:
    check_constraint(Constraint(kind, text), ConstraintLimits(**limits))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        ("json_schema", "[" * 100_000, "json_schema nests 100000 levels .* at most 64 .*--max-grammar-depth"),
        ("json_schema", deep_array_schema(2000), "nests 2000 levels"),
        ("structural_tag", '{"type": "structural_tag", "format": ' + "[" * 5000, "structural_tag nests 5001 levels"),
        ("json_schema", '{"$ref": "#"}', r"\$ref cycle # -> #"),
        (
            "json_schema",
            json.dumps({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
            r"\$ref cycle # -> #/\$defs/a -> #/\$defs/b -> #/\$defs/a",
        ),
        ("json_schema", '{"properties": {"a": {"$ref": "file:///etc/passwd"}}}', "not a local reference"),
        ("json_schema", '{"$ref": "https://example.com/s.json"}', "not a local reference"),
        ("structural_tag", '{"structures": [{"schema": {"$ref": "other.json#/x"}}]}', "not a local reference"),
        ("json_schema", '{"$ref": "#/$defs/missing"}', "points at nothing"),
        ("json_schema", '{"type": "object"', "not valid JSON"),
        ("regex", "a" * (1 << 20 | 1), r"regex is 1048577 bytes; at most 1048576 .*--max-grammar-bytes"),
        ("ebnf", 'root ::= "é"' * 100_000, "ebnf is 1300000 bytes"),  # bytes, not characters
    ],
)
def test_constraints_over_a_limit_are_refused(kind: str, text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        check(kind, text)


def test_choices_count_towards_the_size_limit() -> None:
    with pytest.raises(InvalidArgument, match="choice is 30 bytes; at most 20"):
        check_constraint(Constraint("choice", choices=("a" * 10, "b" * 20)), ConstraintLimits(max_bytes=20))


def test_legitimate_schemas_pass() -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    }
    check("json_schema", json.dumps(tree))  # recursion through a real schema is supported
    check("json_schema", json.dumps({"properties": {"a": {"$ref": "#"}}, "enum": [{"$ref": "http://data"}]}))
    check("json_schema", deep_array_schema(64))
    check("json_schema", json.dumps({"properties": {"a": {"type": "string", "pattern": '[[[[[{{{{{\\"[[['}}}))
    check("regex", "(" * 500 + "a" + ")" * 500)  # regex / EBNF nesting is left to xgrammar's parser


def test_json_depth_skips_brackets_in_strings() -> None:
    assert json_depth('{"a": "[[[{{{", "b": [1, {"c": "]]]\\"[["}]}') == 3
    assert json_depth("[]") == 1 and json_depth('"x"') == 0


def test_constraint_limits_reach_validation() -> None:
    limits = Limits(prompt_len=10, max_model_len=100, vocab_size=50, grammar=ConstraintLimits(max_depth=3))
    with pytest.raises(InvalidArgument, match="at most 3 are allowed"):
        resolve_params(limits, json_schema=deep_array_schema(4))
    resolve_params(limits, json_schema=deep_array_schema(3))


def test_every_limit_is_a_positive_flag_of_the_engine_and_of_turnout_serve(tmp_path: object) -> None:
    from services.engine.main import build_parser as engine_parser
    from turnout.launcher import build_parser
    from turnout.serve_flags import ENGINE, child_flags

    names = [limit.name for limit in request_limit_fields()]
    assert names == [
        "max_n",
        "max_stop_sequences",
        "max_stop_sequence_length",
        "max_grammar_bytes",
        "max_grammar_depth",
        "grammar_compile_timeout",
    ]
    defaults = engine_parser().parse_args(["--model", "/m"])
    assert {n: getattr(defaults, n) for n in names} == {f.name: f.default for f in request_limit_fields()}
    argv = [x for f in request_limit_fields() for x in (limit_flag(f), "2.5" if f.type == "float" else "3")]
    serve = build_parser().parse_args(argv)
    assert child_flags(serve, ENGINE) == argv
    assert child_flags(build_parser().parse_args([]), ENGINE) == []  # unset: the engine's defaults apply
    model = tmp_path / "m"  # type: ignore[operator]
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="--max-n must be positive"):
        EngineConfig(model=model, max_n=0)
    with pytest.raises(ValueError, match="--grammar-compile-timeout must be positive"):
        EngineConfig(model=model, grammar_compile_timeout=float("nan"))


def test_every_limit_is_in_the_docs_table_with_its_default() -> None:
    from tests.e2e.stack import ROOT

    rows = [line for line in (ROOT / "docs" / "api.md").read_text().splitlines() if line.startswith("| ")]
    for limit in request_limit_fields():
        row = next((r for r in rows if f"`{limit_flag(limit)}`" in r), None)
        assert row is not None, f"{limit_flag(limit)} is missing from docs/api.md's limits table"
        default = limit.default if isinstance(limit.default, int) else f"{limit.default:g}"
        assert f"| {default} " in row, f"{row!r} does not give the default {limit.default}"
