"""A model's tokenizer: text to token ids and back, and what its chat template needs.

The Rust `tokenizers` backend does the encoding and decoding. Encoding goes
through `encode_batch`, whose Rust side releases the GIL (`encode` holds it for
the whole call: a 1 MB text stalls every other thread for seconds), so an
encode in a worker thread never stalls the event loop. Chat templates render
elsewhere (chat_prompt.py); this class only says which template and variables.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer
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

    @property
    def chat_template(self) -> str | dict[str, str] | None:
        """The template chats render with: the configured one, else the model's (several by name, or none)."""
        if self._chat_template is not None:
            return self._chat_template
        template: str | dict[str, str] | None = self._hf.chat_template
        return template

    @property
    def template_variables(self) -> dict[str, Any]:
        """What every chat template sees besides the conversation: the special tokens (bos_token, …)."""
        return dict(self._hf.special_tokens_map)

    def settings(self) -> tuple[str, dict[str, Any]]:
        """The transformers class and tokenizer_config.json's settings as loaded (special tokens as their
        text; values with no JSON form left out), with `chat_template` the one chats render with (vLLM's
        /tokenizer_info)."""
        config = {key: shown for key, value in self._hf.init_kwargs.items() if (shown := _as_json(value)) is not _NONE}
        config.pop("chat_template", None)
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return type(self._hf).__name__, config

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        [encoding] = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)

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
        if skip_special_tokens or not spaces_between_special_tokens:
            # decode_batch: its Rust side releases the GIL, as encode_batch's does.
            [text] = self.backend.decode_batch([list(ids)], skip_special_tokens=skip_special_tokens)
            return str(text)
        return decode(
            self.backend,
            ids,
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )


def _read_template(value: str | None) -> str | None:
    """A template given on the command line: a file's path, or the template itself."""
    if value is None:
        return None
    path = Path(value)
    if len(value) < 4096 and path.is_file():
        return path.read_text()
    return value


_NONE = object()


def _as_json(value: Any) -> Any:
    """`value` as JSON data: an AddedToken as its text, containers item by item; _NONE if it has no JSON form."""
    if isinstance(value, AddedToken):
        return value.content
    if isinstance(value, dict):
        items = {str(k): _as_json(v) for k, v in value.items()}
        return {k: v for k, v in items.items() if v is not _NONE}
    if isinstance(value, (list, tuple)):
        return [v for v in map(_as_json, value) if v is not _NONE]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return _NONE
