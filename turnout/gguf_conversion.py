"""A GGUF file as a plain Hugging Face folder: converted once, cached on disk, reused.

`transformers` reads GGUF directly and de-quantizes it to float; loading that takes tens of
seconds, while a converted folder (bf16 safetensors) loads in about one. So every GGUF is
converted once into the cache (`cache_root()/models/gguf/`), keyed by the file's path, size and
modification time and the conversion recipe: an edited file or a fixed recipe converts again.
Conversion writes to a temporary folder and renames it into place, so concurrent callers
(several test workers, two launchers) never see half a model.

The default model's file needs fixes on top of the plain conversion (its special ids, SmolLM's
digit splitting): `turnout/default_model.py` passes them in as a `GgufFixes`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Bump when the conversion below changes, so cached folders are rebuilt.
RECIPE_VERSION = 1


def cache_root() -> Path:
    env = os.environ.get("TURNOUT_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "turnout"


@dataclass(frozen=True)
class GgufFixes:
    """What a particular GGUF needs beyond the plain conversion; each is applied in place."""

    # On the model's config before the weights are copied (special ids, tied embeddings).
    config: Callable[[Any], None] | None = None
    # On the tokenizer before it is saved (pre-tokenizer, special tokens).
    tokenizer: Callable[[Any], None] | None = None


def converted_folder(gguf: Path) -> Path:
    """Where the conversion of `gguf` is cached (whether or not it exists yet)."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{RECIPE_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "models" / "gguf" / f"{gguf.stem}-{digest}"


def convert_once(gguf: Path, target: Path, fixes: GgufFixes | None = None) -> Path:
    """The Hugging Face folder `target` holding `gguf` converted, converting it if not there yet."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as tmp:
        staging = Path(tmp) / "model"
        convert(gguf, staging, fixes or GgufFixes())
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if the winner finished
                raise
    return target


def convert(gguf: Path, out: Path, fixes: GgufFixes) -> None:
    """Write `gguf` as a Hugging Face folder at `out`: bf16 safetensors, config, tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info(f"converting {gguf} into a Hugging Face folder (once; cached)", extra={"out": str(out)})
    directory, name = str(gguf.parent), gguf.name
    with _progress_on_tty_only():
        loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(directory, gguf_file=name)
        if fixes.config is not None:
            fixes.config(config)
        # save_pretrained refuses a model loaded from GGUF: copy its weights into a fresh one.
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.load_state_dict({k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()}, strict=False)
        model.tie_weights()
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if getattr(config, key, None) is not None:
                setattr(model.generation_config, key, getattr(config, key))
        model.save_pretrained(out)

    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    if fixes.tokenizer is not None:
        fixes.tokenizer(tokenizer)
    tokenizer.save_pretrained(out)
    write_rope_theta(out / "config.json")
    log.info("converted", extra={"gguf": str(gguf), "out": str(out)})


@contextlib.contextmanager
def _progress_on_tty_only() -> Iterator[None]:
    """transformers shows bars while it de-quantizes GGUF tensors and loads them, on any stderr; a
    log file or a pipe would get one line per redraw. tqdm's `disable=None` turns a bar off where
    stderr is no TTY; transformers' own bars have a switch."""
    from tqdm.auto import tqdm
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as transformers_logging

    original = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(tqdm, disable=None)  # type: ignore[attr-defined]
    shown = transformers_logging.is_progress_bar_enabled()
    if not sys.stderr.isatty():
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        gguf_utils.tqdm = original  # type: ignore[attr-defined]
        if shown:
            transformers_logging.enable_progress_bar()


def write_rope_theta(config_path: Path) -> None:
    """transformers 5 writes `rope_parameters`; older readers want `rope_theta` too."""
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    config_path.write_text(json.dumps(config, indent=2))
