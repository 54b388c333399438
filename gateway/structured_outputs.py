"""The structured-output fields of every API spelling -> the one constraint on `SamplingParams`.

Users arrive with OpenAI's `response_format`, vLLM's `structured_outputs`,
the older vLLM / Aphrodite `guided_*` fields, SGLang's `regex` / `ebnf` /
`json_schema` / `structural_tag`. All of them name one of six kinds the engine
knows (json_schema, json_object, regex, ebnf, structural_tag, choice); a
request may carry at most one constraint, whatever spelling it came in, and
two are a 400 naming both. Nothing is silently ignored: a spelling we cannot
honour (a custom whitespace pattern) is refused. Grammars themselves are
checked by the engine, which compiles them (a bad schema is its 400, and so is
one over its size and depth limits); here only what Python itself cannot handle
(JSON nested past the interpreter's recursion limit) is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.errors import HTTPError, invalid_request, unsupported
from gateway.protocol import NativeSamplingParams, OpenAIRequest
from turnout.v1 import common_pb2

# The `guided_decoding_backend` names we honour: ours, and vLLM's "auto" (which picks it).
GUIDED_DECODING_BACKENDS = ("xgrammar", "auto")

# vLLM's `structured_outputs` keys; a misspelt key is a 400 rather than a constraint lost.
_STRUCTURED_OUTPUTS_KEYS = {
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "structural_tag",
    "disable_any_whitespace",
    "disable_additional_properties",
    "disable_fallback",
    "whitespace_pattern",
    "backend",
}


@dataclass(frozen=True)
class Constraint:
    # The SamplingParams oneof field: json_schema, json_object, regex, ebnf, structural_tag or choice.
    kind: str
    value: str | bool | list[str]
    # The request field it came from, for errors.
    source: str


@dataclass(frozen=True)
class StructuredOutput:
    constraint: Constraint | None = None
    disable_any_whitespace: bool | None = None

    def apply(self, sp: common_pb2.SamplingParams) -> None:
        if self.constraint is not None:
            kind, value = self.constraint.kind, self.constraint.value
            if kind == "choice":
                assert isinstance(value, list)
                sp.choice.values.extend(value)
            else:
                setattr(sp, kind, value)
        if self.disable_any_whitespace is not None:
            sp.disable_any_whitespace = self.disable_any_whitespace


def openai_structured_output(req: OpenAIRequest) -> StructuredOutput:
    found: list[Constraint] = []
    whitespace: bool | None = None
    if req.response_format is not None:
        found.extend(_response_format(req.response_format))
    if req.structured_outputs is not None:
        constraints, whitespace = _structured_outputs(req.structured_outputs)
        found.extend(constraints)
    if req.guided_json is not None:
        found.append(Constraint("json_schema", _schema_text(req.guided_json, "guided_json"), "guided_json"))
    if req.guided_regex is not None:
        found.append(Constraint("regex", _non_empty(req.guided_regex, "guided_regex"), "guided_regex"))
    if req.guided_choice is not None:
        found.append(Constraint("choice", _choices(req.guided_choice, "guided_choice"), "guided_choice"))
    if req.guided_grammar is not None:
        found.append(Constraint("ebnf", _non_empty(req.guided_grammar, "guided_grammar"), "guided_grammar"))
    if req.regex is not None:
        found.append(Constraint("regex", _non_empty(req.regex, "regex"), "regex"))
    if req.ebnf is not None:
        found.append(Constraint("ebnf", _non_empty(req.ebnf, "ebnf"), "ebnf"))
    if req.structural_tag is not None:
        tag = req.structural_tag if isinstance(req.structural_tag, str) else json.dumps(req.structural_tag)
        found.append(Constraint("structural_tag", _non_empty(tag, "structural_tag"), "structural_tag"))
    if req.guided_whitespace_pattern is not None:
        raise unsupported(
            "guided_whitespace_pattern",
            "is not supported: xgrammar has no custom whitespace pattern; "
            "use 'structured_outputs': {'disable_any_whitespace': true} for compact JSON",
        )
    if req.guided_decoding_backend is not None:
        # Constraints are compiled by xgrammar: that name (or vLLM's "auto", which picks it) is honoured,
        # and its option list may ask for compact JSON; another backend's name is refused, not ignored.
        backend, _, options = req.guided_decoding_backend.partition(":")
        if backend not in GUIDED_DECODING_BACKENDS:
            raise invalid_request(
                f"'guided_decoding_backend' {backend!r} is not available: constraints are compiled by xgrammar "
                f"(use one of {', '.join(repr(b) for b in GUIDED_DECODING_BACKENDS)})",
                "guided_decoding_backend",
            )
        if "disable-any-whitespace" in options.split(","):
            whitespace = True
    return StructuredOutput(_only_one(found), whitespace)


def native_structured_output(params: NativeSamplingParams) -> StructuredOutput:
    found = [
        Constraint(name, _non_empty(getattr(params, name), f"sampling_params.{name}"), f"sampling_params.{name}")
        for name in ("json_schema", "regex", "ebnf", "structural_tag")
        if getattr(params, name) is not None
    ]
    return StructuredOutput(_only_one(found), params.disable_any_whitespace)


def _only_one(found: list[Constraint]) -> Constraint | None:
    if len(found) > 1:
        names = " and ".join(f"'{c.source}'" for c in found)
        raise invalid_request(f"only one structured-output constraint may be given, got {names}", found[1].source)
    return found[0] if found else None


def _response_format(fmt: dict[str, Any]) -> list[Constraint]:
    kind = fmt.get("type")
    if kind == "text":
        return []
    if kind == "json_object":
        return [Constraint("json_object", True, "response_format")]
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise invalid_request(
                "'response_format' of type 'json_schema' needs 'json_schema': {'name': ..., 'schema': {...}}",
                "response_format.json_schema",
            )
        return [
            Constraint(
                "json_schema", _schema_text(spec["schema"], "response_format.json_schema.schema"), "response_format"
            )
        ]
    if kind == "structural_tag":
        # SGLang's form: the whole object ({type, structures, triggers} or {type, format}) is the tag.
        return [Constraint("structural_tag", json.dumps(fmt), "response_format")]
    raise invalid_request(
        f"'response_format.type' must be one of 'text', 'json_object', 'json_schema', 'structural_tag', got {kind!r}",
        "response_format.type",
    )


def _structured_outputs(spec: dict[str, Any]) -> tuple[list[Constraint], bool | None]:
    unknown = sorted(set(spec) - _STRUCTURED_OUTPUTS_KEYS)
    if unknown:
        raise invalid_request(f"'structured_outputs' has unknown keys: {', '.join(unknown)}", "structured_outputs")
    if spec.get("whitespace_pattern") is not None:
        raise unsupported(
            "structured_outputs.whitespace_pattern",
            "is not supported: xgrammar has no custom whitespace pattern; use 'disable_any_whitespace'",
        )
    found = []
    source = "structured_outputs"
    if spec.get("json") is not None:
        schema = spec["json"]
        if spec.get("disable_additional_properties"):
            try:
                schema = _closed_objects(_schema_object(schema, f"{source}.json"))
            except RecursionError:
                raise _too_deep(f"{source}.json") from None
        found.append(Constraint("json_schema", _schema_text(schema, f"{source}.json"), f"{source}.json"))
    for key, kind in (("regex", "regex"), ("grammar", "ebnf")):
        if spec.get(key) is not None:
            found.append(
                Constraint(
                    kind, _non_empty(_string(spec[key], f"{source}.{key}"), f"{source}.{key}"), f"{source}.{key}"
                )
            )
    if spec.get("choice") is not None:
        found.append(Constraint("choice", _choices(spec["choice"], f"{source}.choice"), f"{source}.choice"))
    if spec.get("json_object"):
        found.append(Constraint("json_object", True, f"{source}.json_object"))
    if spec.get("structural_tag") is not None:
        tag = spec["structural_tag"]
        text = tag if isinstance(tag, str) else json.dumps(tag)
        found.append(
            Constraint("structural_tag", _non_empty(text, f"{source}.structural_tag"), f"{source}.structural_tag")
        )
    whitespace = spec.get("disable_any_whitespace")
    if whitespace is not None and not isinstance(whitespace, bool):
        raise invalid_request("'structured_outputs.disable_any_whitespace' must be a boolean", source)
    return found, whitespace


def _schema_text(schema: Any, param: str) -> str:
    """A JSON schema given as an object or as JSON text -> JSON text of an object."""
    try:
        return json.dumps(_schema_object(schema, param))
    except RecursionError:
        raise _too_deep(param) from None


def _too_deep(param: str) -> HTTPError:
    return invalid_request(f"'{param}' is nested too deeply to be a JSON schema", param)


def _schema_object(schema: Any, param: str) -> dict[str, Any] | bool:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise invalid_request(f"'{param}' is not valid JSON: {exc}", param) from None
        except RecursionError:
            raise _too_deep(param) from None
    if not isinstance(schema, dict | bool):
        raise invalid_request(f"'{param}' must be a JSON schema (an object), got {type(schema).__name__}", param)
    return schema


def _closed_objects(schema: Any) -> Any:
    """vLLM disable_additional_properties: every object schema without an explicit
    `additionalProperties` gets `false`, recursively."""
    if isinstance(schema, list):
        return [_closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _closed_objects(value) for key, value in schema.items()}
    if out.get("type") == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _choices(values: Any, param: str) -> list[str]:
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise invalid_request(f"'{param}' must be a non-empty list of strings", param)
    return values


def _string(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise invalid_request(f"'{param}' must be a string", param)
    return value


def _non_empty(value: str, param: str) -> str:
    if not value:
        raise invalid_request(f"'{param}' must not be empty", param)
    return value
