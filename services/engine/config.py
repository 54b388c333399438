"""Engine settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class EngineConfig:
    model: Path
    # Name clients use in `model`; defaults to the model folder's name.
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 50051
    device: str = "auto"
    dtype: str = "auto"
    # Cap on prompt + output tokens; defaults to the model's own context length.
    max_model_len: int | None = None
    # Requests allowed to wait for their turn before new ones are refused (RESOURCE_EXHAUSTED).
    max_waiting_requests: int = 256

    def __post_init__(self) -> None:
        if not (self.model / "config.json").is_file():
            raise ValueError(f"--model {self.model}: no config.json there (expected a Hugging Face model folder)")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"--max-model-len must be positive, got {self.max_model_len}")
        if self.max_waiting_requests < 0:
            raise ValueError("--max-waiting-requests must be >= 0")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.resolve().name

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
