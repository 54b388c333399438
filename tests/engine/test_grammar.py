"""Structured outputs on the tiny random model: its weights are random, so only the grammar makes
the output valid. Offline API (`LLM`) for the constraint kinds, LLMEngine for the mixed batch."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from services.engine.convert import finish_to_proto
from services.engine.request import EngineRequest, Finish
from turnout import LLM
from turnout.errors import InvalidArgument

SCHEMAS = [
    {  # nested object, integer range, enum
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
            "kind": {"enum": ["cat", "dog", "bird"]},
            "owner": {
                "type": "object",
                "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}, "vip": {"type": "boolean"}},
                "required": ["age", "vip"],
                "additionalProperties": False,
            },
        },
        "required": ["id", "kind", "owner"],
        "additionalProperties": False,
    },
    {  # array of bounded objects
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 5}, "tag": {"enum": ["a", "b"]}},
                    "required": ["n", "tag"],
                    "additionalProperties": False,
                },
            },
            "name": {"type": "string", "minLength": 1, "maxLength": 6},
        },
        "required": ["items", "name"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 10}, "minItems": 2, "maxItems": 4},
]


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(tiny_model_dir, num_kv_blocks=512)


def outside_strings(text: str) -> str:
    """JSON text with each string literal's content removed (its quotes stay, so runs around it stay apart)."""
    out, in_string, escaped = [], False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                out.append(ch)
        else:
            in_string = ch == '"'
            out.append(ch)
    return "".join(out)


@pytest.mark.parametrize("schema", SCHEMAS, ids=["nested", "array-of-objects", "numbers"])
def test_json_schema_output_validates_every_time(llm: LLM, schema: dict[str, object]) -> None:
    params = {"json_schema": json.dumps(schema), "max_new_tokens": 400, "temperature": 1.0, "n": 3}
    outputs = llm.generate(["Write JSON:", "data"], [{**params, "seed": 1}, {**params, "seed": 2}])
    for out in outputs:
        assert len(out.samples) == 3
        for sample in out.samples:
            assert sample.finish == Finish("stop"), sample.text  # the grammar ended it, not the length
            jsonschema.validate(json.loads(sample.text), schema)
    assert len({s.text for o in outputs for s in o.samples}) > 1  # samples differ: each has its own matcher


def test_whitespace_runs_are_bounded_or_disabled(llm: LLM) -> None:
    schema = json.dumps(SCHEMAS[0])
    loose = llm.generate(["a", "b", "c"], {"json_schema": schema, "max_new_tokens": 400, "temperature": 1.0, "seed": 5})
    longest = max((len(m) for o in loose for m in re.findall(r"\s+", outside_strings(o.text))), default=0)
    assert 0 < longest <= llm.engine.config.grammar_max_whitespace
    compact = llm.generate(
        ["a", "b", "c"],
        {"json_schema": schema, "disable_any_whitespace": True, "max_new_tokens": 400, "temperature": 1.0, "seed": 5},
    )
    for out in compact:
        jsonschema.validate(json.loads(out.text), SCHEMAS[0])
        assert not re.search(r"\s", outside_strings(out.text)), out.text


def test_json_object_parses_to_an_object(llm: LLM) -> None:
    outputs = llm.generate(["x", "y"], {"json_object": True, "max_new_tokens": 300, "temperature": 1.0, "seed": 3})
    for out in outputs:
        assert out.finish == Finish("stop"), out.text
        assert isinstance(json.loads(out.text), dict)


def test_regex_ebnf_and_choice(llm: LLM) -> None:
    # Bounded languages: a random model rarely picks EOS, so an open-ended tail would run to the length.
    regex = r"[a-z]{2,5}-[0-9]{3}(\.[a-z]{1,4})?"
    ebnf = 'root ::= "(" item "," item ")" | "[" item "]"\nitem ::= [0-9] | "x" [0-9]'
    choices = ["yes", "no", 'a "quoted" | choice', "line\nbreak"]
    for seed in range(4):
        common = {"max_new_tokens": 64, "temperature": 1.0, "seed": seed}
        by_regex, by_ebnf, by_choice = llm.generate(
            ["p", "q", "r"],
            [{"regex": regex, **common}, {"ebnf": ebnf, **common}, {"choice": {"values": choices}, **common}],
        )
        assert re.fullmatch(regex, by_regex.text) and by_regex.finish == Finish("stop")
        assert re.fullmatch(r"\(x?[0-9],x?[0-9]\)|\[x?[0-9]\]", by_ebnf.text), by_ebnf.text
        assert by_choice.text in choices and by_choice.finish == Finish("stop")


def test_structural_tags_legacy_and_current_format(llm: LLM) -> None:
    current = {"type": "structural_tag", "format": {"type": "const_string", "value": "hello there"}}
    out = llm.generate("x", {"structural_tag": json.dumps(current), "max_new_tokens": 16, "temperature": 1.0})[0]
    assert out.text == "hello there" and out.finish == Finish("stop")
    legacy = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    out = llm.generate("x", {"structural_tag": json.dumps(legacy), "max_new_tokens": 8, "temperature": 0})[0]
    assert out.finish.kind in ("stop", "length")  # free text until a trigger: it compiles and runs


def test_ignore_eos_still_finishes_when_the_grammar_does(llm: LLM) -> None:
    out = llm.generate("x", {"choice": {"values": ["alpha", "beta"]}, "ignore_eos": True, "max_new_tokens": 50})[0]
    assert out.text in ("alpha", "beta") and out.finish == Finish("stop")


def test_grammar_finish_is_a_stop_with_nothing_matched() -> None:
    reason = finish_to_proto(Finish("stop"), 3)
    assert reason.WhichOneof("kind") == "stop" and reason.stop.WhichOneof("matched") is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"json_schema": "{not json"}, "json_schema is not valid JSON: Expecting property name"),
        ({"json_schema": '{"type": 5}'}, "json_schema: the constraint does not compile"),
        ({"regex": "a(b"}, "regex: the constraint does not compile: Regex parsing error at position 4"),
        ({"ebnf": 'start ::= "a"'}, 'ebnf: the constraint does not compile: .*"root" is not found'),
        ({"structural_tag": '{"type": "structural_tag", "format": {"type": "bogus"}}'}, "structural_tag: .*bogus"),
        ({"structural_tag": "[1]"}, "structural_tag must be a JSON object"),
        ({"choice": {"values": []}}, "choice: the list of choices must not be empty"),
        ({"regex": ""}, "regex must not be empty"),
    ],
)
def test_invalid_constraints_are_refused_before_scheduling(llm: LLM, params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        llm.generate(["fine", "bad"], [{"max_new_tokens": 4}, params])
    assert not llm.engine.has_work()


def test_a_grammar_that_leaves_no_token_aborts_only_its_request(llm: LLM) -> None:
    digit_free = llm.tokenizer.encode("a", add_special_tokens=False)
    boxed, free = llm.generate(
        ["x", "x"],
        [
            {"regex": "[0-9]+", "allowed_token_ids": digit_free, "max_new_tokens": 8},
            {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
        ],
    )
    assert boxed.finish.kind == "abort" and "grammar allows no token" in boxed.finish.message
    assert len(free.output_token_ids) == 8


def test_compiles_once_per_distinct_constraint(llm: LLM) -> None:
    compiler = llm.engine.grammars
    before = compiler.num_compiled
    params = {"json_schema": '{"type": "object", "properties": {"q": {"type": "integer"}}}', "max_new_tokens": 30}
    llm.generate(["a", "b", "c"], params)
    llm.generate("d", params)
    assert compiler.num_compiled == before + 1
    llm.generate("e", {**params, "disable_any_whitespace": True})  # another constraint: compiled again
    assert compiler.num_compiled == before + 2


def test_mixed_batch_constrained_validate_unconstrained_match_solo(llm: LLM) -> None:
    schema = SCHEMAS[0]
    greedy = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    prompts = [f"request number {i}" for i in range(40)]
    params = [
        {"json_schema": json.dumps(schema), "temperature": 1.0, "seed": i, "max_new_tokens": 300} if i % 2 else greedy
        for i in range(40)
    ]
    outputs = llm.generate(prompts, params)
    for i, out in enumerate(outputs):
        if i % 2:
            jsonschema.validate(json.loads(out.text), schema)
        else:
            assert out.output_token_ids == llm.generate(prompts[i], greedy)[0].output_token_ids


def test_engine_request_without_compiled_grammar_is_compiled_on_add(llm: LLM) -> None:
    request = llm._request("x", {"regex": "[0-9]{4}", "max_new_tokens": 10})
    bare = EngineRequest(request.request_id, request.input_ids, request.sampling)  # grammar not compiled yet
    llm.engine.add_request(bare)
    out = llm._run({bare.request_id: list(bare.input_ids)}, {bare.request_id: 1})[0]
    assert re.fullmatch("[0-9]{4}", out.text)


def test_chat_json_schema_greedy_and_sampled_samples_stop_and_validate(llm: LLM) -> None:
    """A chat-templated request under a schema, greedy and sampled with n=2: every sample closes its
    object and stops (the schema bounds every field, so the grammar ends well within the token cap).
    The pretrained model's structured outputs are checked end to end in tests/e2e/test_structured_outputs_api.py."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]}, "maxItems": 3},
        },
        "required": ["name", "age", "languages"],
        "additionalProperties": False,
    }
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Describe a person as JSON with name, age and languages."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    params = {"json_schema": json.dumps(schema), "max_new_tokens": 200}
    outputs = llm.generate([prompt] * 2, [{**params, "temperature": 0}, {**params, "temperature": 0.8, "n": 2}])
    assert [len(out.samples) for out in outputs] == [1, 2]
    for out in outputs:
        for sample in out.samples:
            assert sample.finish == Finish("stop"), sample.text
            jsonschema.validate(json.loads(sample.text), schema)


def test_unconstrained_batches_pass_no_hooks(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy-only unconstrained batches must keep the sampler's single-argmax fast path."""
    import services.engine.step_sampler as step_sampler

    seen: list[int] = []
    real = step_sampler.sample

    def spy(logits: Any, rows: Any, extra_masks: Any = (), fused_draw: Any = None) -> Any:
        seen.append(len(extra_masks))
        return real(logits, rows, extra_masks, fused_draw)

    monkeypatch.setattr(step_sampler, "sample", spy)
    llm.generate(["a", "b"], {"temperature": 0, "max_new_tokens": 3, "ignore_eos": True})
    assert seen and set(seen) == {0}
    seen.clear()
    llm.generate(["a", "b"], [{"temperature": 0, "max_new_tokens": 3}, {"regex": "[0-9]{3}", "max_new_tokens": 3}])
    assert 1 in seen
