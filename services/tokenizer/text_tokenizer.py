"""A model's tokenizer: plain text and chat messages to token ids, and back.

transformers renders chat templates (Jinja, with tools, documents and extra
kwargs); the Rust `tokenizers` backend does the encoding and decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from services.tokenizer.detokenizer import decode
from services.tokenizer.token_table import TokenTable
from turnout.errors import InvalidArgument


class TextTokenizer:
    def __init__(self, model: Path, chat_template: str | None = None) -> None:
        self._hf: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(model)
        self.backend: Tokenizer = self._hf.backend_tokenizer
        self._chat_template = _read_template(chat_template)
        self._token_table = TokenTable(self.backend)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_texts(self, texts: Sequence[str], *, add_special_tokens: bool = False) -> list[list[int]]:
        """Each text encoded on its own, in order (an empty text gives no ids)."""
        if not texts:
            return []
        return [list(e.ids) for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def token_texts(self, ids: Sequence[int]) -> tuple[list[str], list[bytes]]:
        """Each token decoded alone (special tokens kept) and its own bytes; see TokenTable."""
        return self._token_table.lookup(ids)

    def decode(
        self, ids: Sequence[int], *, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> str:
        vocab = self.vocab_size
        bad = [t for t in ids if t >= vocab]
        if bad:
            raise InvalidArgument(f"token id {bad[0]} is out of range for a vocabulary of {vocab}")
        return decode(
            self.backend,
            ids,
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[Any, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text a conversation renders to with the chat template."""
        if not messages:
            raise InvalidArgument("messages must not be empty")
        if add_generation_prompt and continue_final_message:
            raise InvalidArgument("add_generation_prompt and continue_final_message cannot both be true")
        if continue_final_message and messages[-1].get("role") != "assistant":
            raise InvalidArgument("continue_final_message needs the last message to be from the assistant")
        template = chat_template or self._chat_template
        if template is None and self._hf.chat_template is None:
            raise InvalidArgument("this model has no chat template; pass one with chat_template")
        template_tools: list[Any] | None = list(tools) if tools else None
        try:
            rendered = self._hf.apply_chat_template(
                messages,
                tools=template_tools,
                documents=documents or None,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **(template_kwargs or {}),
            )
        except jinja2.TemplateError as exc:
            raise InvalidArgument(f"chat template failed: {exc}") from None
        except ValueError as exc:  # transformers' own checks on messages and options
            raise InvalidArgument(f"chat template: {exc}") from None
        assert isinstance(rendered, str)
        return rendered


def _read_template(value: str | None) -> str | None:
    """A template given on the command line: a file's path, or the template itself."""
    if value is None:
        return None
    path = Path(value)
    if len(value) < 4096 and path.is_file():
        return path.read_text()
    return value
