"""`unknown_fields`: the undeclared fields of a body and of the models nested in it, in declared order."""

from __future__ import annotations

from gateway.protocol import ChatCompletionRequest, NativeGenerateRequest, unknown_fields


def test_nested_extras_come_in_declared_order_whatever_order_the_json_gave() -> None:
    # Declared: stream_options, response_format, messages, tools; the JSON gives them in another order.
    body = ChatCompletionRequest.model_validate(
        {
            "tools": [{"type": "function", "function": {"name": "f", "x_tool": 1}, "x_outer": 2}],
            "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "yo", "x_msg": 3}],
            "stream": True,
            "stream_options": {"include_usage": True, "x_opt": 4},
            "x_top": 5,
        }
    )
    assert unknown_fields(body) == [
        "x_top",
        "stream_options.x_opt",
        "messages[1].x_msg",
        "tools[0].x_outer",
        "tools[0].function.x_tool",
    ]


def test_lists_of_plain_values_and_unset_fields_name_nothing() -> None:
    body = NativeGenerateRequest.model_validate(
        {"input_ids": list(range(5000)), "sampling_params": {"max_new_tokens": 4, "stop": ["a", "b"]}}
    )
    assert unknown_fields(body) == []
    assert unknown_fields(NativeGenerateRequest.model_validate({"text": "x", "x": [1]})) == ["x"]
