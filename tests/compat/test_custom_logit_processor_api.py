"""SGLang's CustomLogitProcessor API (python/sglang/srt/sampling/custom_logit_processor.py): `to_str`
is a classmethod, called on the class as SGLang's docs and tests do."""

from __future__ import annotations

from typing import Any

from turnout.custom_logit_processor import CustomLogitProcessor


class _OnlyToken(CustomLogitProcessor):
    def __call__(self, logits: Any, custom_param_list: list[dict[str, Any]]) -> Any:
        return logits


def test_to_str_is_called_on_the_class() -> None:
    text = _OnlyToken.to_str()
    assert text == _OnlyToken().to_str()
    assert isinstance(CustomLogitProcessor.from_str(text), _OnlyToken)
