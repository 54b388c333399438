"""Tokenizer service settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.tokenizer.reasoning import REASONING_PARSERS, reasoning_parser_class
from services.tokenizer.tool_parsers import TOOL_PARSERS, tool_parser_class
from turnout.flags import flag, spelled
from turnout.security import ServiceSecurity
from turnout.telemetry.metrics_http import check_metrics_port

MIB = 1024 * 1024
CONTENT_FORMATS = ("auto", "string", "openai")


def _limit(default: Any, help_text: str, *, metavar: str) -> Any:
    """A limit's declaration: its default, and the help text its --flag (and the docs) show."""
    return flag(default, help_text, metavar=metavar)


@dataclass(frozen=True)
class TokenizerLimits:
    """Bounds on the work one request may cause; each field is a --flag of the same name."""

    max_prompt_bytes: int = _limit(
        4 * MIB,
        "longest prompt in UTF-8 bytes, checked before encoding: a text prompt, a rendered chat (the chat "
        "template's output stops there), the texts of one EncodeTexts together. 4 MiB is about a million "
        "tokens of English, the longest contexts served today",
        metavar="BYTES",
    )
    max_token_ids: int = _limit(
        1 << 20, "most token ids in one Decode or TokenTexts request (1 Mi: beyond any context)", metavar="N"
    )
    max_encode_texts: int = _limit(4096, "most texts in one EncodeTexts request (stop strings, bad words)", metavar="N")
    chat_template_timeout: float = _limit(
        5.0, "seconds a chat template may render before its worker is killed and the request refused", metavar="S"
    )
    chat_template_workers: int = _limit(
        2, "processes rendering chat templates (each one slow template occupies one until the timeout)", metavar="N"
    )

    def __post_init__(self) -> None:
        for name in ("max_prompt_bytes", "max_token_ids", "max_encode_texts", "chat_template_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{flag_name(name)} must be at least 1, got {getattr(self, name)}")
        if not self.chat_template_timeout > 0:
            raise ValueError(f"--chat-template-timeout must be positive, got {self.chat_template_timeout}")

    @property
    def render_memory_bytes(self) -> int:
        """Address space of a render worker: the interpreter and Jinja (~100 MiB of mappings) plus room for
        the request and an output of max_prompt_bytes in Python's widest string form (4 bytes a character)."""
        return 512 * MIB + 16 * self.max_prompt_bytes


def flag_name(name: str) -> str:
    return name.replace("_", "-")


@dataclass(frozen=True)
class TokenizerConfig:
    model: Path = flag(help="Hugging Face model folder (its tokenizer files, unless --tokenizer)")
    # A folder whose tokenizer files replace the model's (vLLM's --tokenizer).
    tokenizer: Path | None = flag(
        None, "folder of the tokenizer files, when not the model's", aliases=("--tokenizer-path",)
    )
    host: str = flag("127.0.0.1", "address the gRPC service listens on")
    port: int = flag(50052, "port the gRPC service listens on")
    # A Jinja chat template that replaces the model's own (file path or inline text).
    chat_template: str | None = flag(None, "Jinja chat template (file path or text) instead of the model's")
    # How a message's content reaches the template: `string` joins text parts into one string (every
    # template renders it); `openai` passes the parts list. `auto` is `string`.
    chat_template_content_format: str = flag(
        "auto",
        "how message content reaches the chat template: string (text parts joined), openai (a list of "
        "parts), auto (string)",
        choices=CONTENT_FORMATS,
    )
    # Splits `<think>` blocks out for requests with separate_reasoning (a name in reasoning.REASONING_PARSERS).
    reasoning_parser: str | None = flag(
        None,
        "split <think> blocks into reasoning_text for requests with separate_reasoning (vLLM's deepseek_r1 is "
        "deepseek-r1)",
        choices=tuple(sorted(REASONING_PARSERS)),
        parse=spelled({"deepseek_r1": "deepseek-r1"}),
    )
    # Reads tool calls for tool_choice "auto" (a name in tool_parsers.TOOL_PARSERS).
    tool_call_parser: str | None = flag(
        None,
        "read tool calls from the output for tool_choice 'auto' (none: such requests are refused; SGLang's "
        "llama3 is llama3_json)",
        choices=tuple(sorted(TOOL_PARSERS)),
        parse=spelled({"llama3": "llama3_json"}),
    )
    # vLLM's switch for tool_choice "auto": here it is on whenever a tool-call parser is set, so the
    # flag only checks that one is.
    enable_auto_tool_choice: bool = flag(
        False, "accepted for vLLM: tool_choice 'auto' is on whenever --tool-call-parser is given (it needs one)"
    )
    # Port of the Prometheus /metrics HTTP endpoint (None: not served).
    metrics_port: int | None = None
    limits: TokenizerLimits = TokenizerLimits()
    # Who may call this service, and TLS (turnout/security.py; the CLI refuses to start without a token).
    security: ServiceSecurity = field(default_factory=ServiceSecurity)

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (the parser reads the calls)")
        if self.reasoning_parser is not None:
            reasoning_parser_class(self.reasoning_parser)
        if self.tool_call_parser is not None:
            tool_parser_class(self.tool_call_parser)
        which = "--tokenizer" if self.tokenizer is not None else "--model"
        folder = self.tokenizer_folder
        if not folder.is_dir():
            raise ValueError(f"{which} {folder}: not a folder")
        if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            raise ValueError(f"{which} {folder}: no tokenizer.json or tokenizer_config.json there")
        check_metrics_port(self.metrics_port)

    @property
    def tokenizer_folder(self) -> Path:
        return self.tokenizer if self.tokenizer is not None else self.model

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
