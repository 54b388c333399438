"""Model references as `vllm serve` takes them: a folder, a GGUF file, a Hugging Face id from the
local cache (fabricated here in the cache's own layout; nothing is downloaded); each failure with
its own message naming what was looked for and where."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.models import TOKENIZER_FILES, build_tiny_gguf
from turnout import default_model
from turnout.child_processes import free_port
from turnout.model_reference import ModelNotFound, hub_cache_dir, resolve

MAIN = "a" * 40
TAGGED = "b" * 40


def fabricate_hub_cache(hub: Path, repo_id: str, snapshots: dict[str, Path], refs: dict[str, str]) -> Path:
    """`hub/models--org--name/{blobs,snapshots/<commit>,refs/<ref>}` as huggingface_hub writes
    it: each snapshot file a symlink into blobs/."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    for commit, source in snapshots.items():
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for file in source.iterdir():
            blob = repo / "blobs" / f"{commit}-{file.name}"
            blob.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(file, blob)
            (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    for ref, commit in refs.items():
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return repo


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture
def cached_tiny(hf_home: Path, tiny_model_dir: Path) -> Path:
    """org/tiny in the cache: `main` at one commit, tag `v1` at another."""
    return fabricate_hub_cache(
        hf_home / "hub", "org/tiny", {MAIN: tiny_model_dir, TAGGED: tiny_model_dir}, {"main": MAIN, "v1": TAGGED}
    )


def test_a_hub_id_resolves_to_its_snapshot_in_the_local_cache(cached_tiny: Path) -> None:
    resolved = resolve("org/tiny")
    assert resolved.folder == cached_tiny / "snapshots" / MAIN
    assert json.loads((resolved.folder / "config.json").read_text())["num_hidden_layers"] == 2
    assert (resolved.source, resolved.name) == ("hub", "org/tiny")  # served as written, as vLLM does


@pytest.mark.parametrize(("revision", "commit"), [(None, MAIN), ("main", MAIN), ("v1", TAGGED), (TAGGED, TAGGED)])
def test_the_revision_picks_the_snapshot(cached_tiny: Path, revision: str | None, commit: str) -> None:
    assert resolve("org/tiny", revision=revision).folder == cached_tiny / "snapshots" / commit


def test_download_dir_is_the_cache_looked_in(tmp_path: Path, hf_home: Path, tiny_model_dir: Path) -> None:
    elsewhere = tmp_path / "downloads"
    fabricate_hub_cache(elsewhere, "org/tiny", {MAIN: tiny_model_dir}, {"main": MAIN})
    assert resolve("org/tiny", download_dir=elsewhere).folder == elsewhere / "models--org--tiny" / "snapshots" / MAIN
    with pytest.raises(ModelNotFound, match=f"not in the Hugging Face cache at {hf_home / 'hub'} "):
        resolve("org/tiny")


def test_hf_hub_cache_wins_over_hf_home(tmp_path: Path, hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    assert hub_cache_dir() == tmp_path / "hub-cache"
    monkeypatch.delenv("HF_HUB_CACHE")
    assert hub_cache_dir() == hf_home / "hub"


def test_an_id_not_in_the_cache_offline_says_where_it_looked(hf_home: Path) -> None:
    with pytest.raises(ModelNotFound) as raised:
        resolve("org/x")
    assert str(raised.value) == (
        f"model 'org/x' is not a folder, not a GGUF file, and not in the Hugging Face cache at "
        f"{hf_home / 'hub'} (HF_HUB_OFFLINE=1: not downloaded)"
    )


def test_a_bare_id_not_in_the_cache_is_looked_up_as_an_id(hf_home: Path) -> None:
    with pytest.raises(ModelNotFound, match=r"^model 'gpt2' is not a folder, not a GGUF file, and not in the Hugging"):
        resolve("gpt2")


def test_a_revision_not_in_the_cache_is_named(cached_tiny: Path, hf_home: Path) -> None:
    with pytest.raises(ModelNotFound, match=r"cache at .*/hub \(revision 'v9'\) \(HF_HUB_OFFLINE=1"):
        resolve("org/tiny", revision="v9")


def test_an_unreachable_hub_is_named_with_the_reason(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    started = time.monotonic()
    with pytest.raises(ModelNotFound) as raised:
        resolve("org/x")
    message = str(raised.value)
    assert f"not in the Hugging Face cache at {hf_home / 'hub'}" in message
    assert f"could not be downloaded from {endpoint} (ConnectError" in message
    assert "HF_HUB_OFFLINE=1" in message
    assert time.monotonic() - started < 30


def test_a_folder_is_used_as_it_is(tiny_model_dir: Path) -> None:
    resolved = resolve(str(tiny_model_dir))
    assert (resolved.folder, resolved.source, resolved.name) == (tiny_model_dir, "folder", tiny_model_dir.name)


def test_a_folder_without_config_json_is_not_a_model_but_may_be_a_tokenizer(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    folder = tmp_path / "tokenizer-only"
    folder.mkdir()
    for name in TOKENIZER_FILES:
        if (tiny_model_dir / name).is_file():
            shutil.copy(tiny_model_dir / name, folder / name)
    with pytest.raises(ModelNotFound) as raised:
        resolve(folder)
    assert str(raised.value) == (
        f"model '{folder}' is a folder without config.json (expected a Hugging Face model folder; looked in {folder})"
    )
    assert resolve(folder, kind="tokenizer").folder == folder
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        ModelNotFound, match=r"^tokenizer .* is a folder without tokenizer.json or tokenizer_config.json"
    ):
        resolve(tmp_path / "empty", kind="tokenizer")


@pytest.mark.parametrize("reference", ["/no/such/model", "./models/x", "~/no-such-turnout-model", "x.gguf", "a/b/c"])
def test_a_missing_path_is_not_looked_up_on_the_hub(hf_home: Path, reference: str) -> None:
    with pytest.raises(ModelNotFound, match=rf"^model '{reference}': no such file or folder \("):
        resolve(reference)


def test_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelNotFound, match=r"is a file, not a folder or a \.gguf file$"):
        resolve(tmp_path / "weights.bin")


def test_a_gguf_file_that_does_not_convert_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNOUT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelNotFound, match=r"is a GGUF file that could not be converted into .*cache/models/gguf/"):
        resolve(tmp_path / "broken.gguf")


def test_the_default_models_gguf_by_path_is_its_converted_folder(default_model_dir: Path) -> None:
    resolved = resolve(default_model.gguf_path())
    assert (resolved.folder, resolved.source) == (default_model_dir, "gguf")


def test_a_gguf_file_is_converted_once_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any GGUF (here a tiny one, so none of the default model's fixes apply) becomes a Hugging
    Face folder the engine loads; the second resolve reuses it."""
    import torch

    from services.engine.models.weights import build_model

    monkeypatch.setenv("TURNOUT_CACHE_DIR", str(tmp_path / "cache"))
    gguf = build_tiny_gguf(tmp_path / "tiny.gguf", default_model.gguf_path())

    first = resolve(gguf)

    assert first.folder.parent == tmp_path / "cache" / "models" / "gguf"
    assert (first.source, first.name) == ("gguf", "tiny")
    _, config = build_model(first.folder, torch.float32, "cpu")
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 64, 1024)
    assert (first.folder / "tokenizer.json").is_file()
    written = (first.folder / "config.json").stat().st_mtime_ns
    started = time.monotonic()
    assert resolve(gguf).folder == first.folder
    assert time.monotonic() - started < 2
    assert (first.folder / "config.json").stat().st_mtime_ns == written
