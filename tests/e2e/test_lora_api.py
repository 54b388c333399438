"""LoRA adapters through all four services: vLLM's `model=<adapter>`, `--lora-modules`, /v1/models
with `parent`, /v1/load_lora_adapter and /v1/unload_lora_adapter behind the admin key; SGLang's
`lora_path`, one per prompt; the 400s naming the problem."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.credentials import TEST_ADMIN_KEY
from tests.e2e.stack import Stack, start_stack
from tests.engine.test_engine_parity import hf_greedy
from tests.lora_adapters import build_lora_adapter, merged_reference

pytestmark = pytest.mark.e2e

ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}
PROMPT = [1000 + i for i in range(20)]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-adapters")
    return {
        "sql": build_lora_adapter(tiny_model_dir, root / "sql", seed=1),
        "chat": build_lora_adapter(tiny_model_dir, root / "chat", seed=2, rank=4, targets=("q_proj", "v_proj")),
        "wide": build_lora_adapter(tiny_model_dir, root / "wide", seed=3, rank=32),
        "head": build_lora_adapter(tiny_model_dir, root / "head", seed=4, targets=("q_proj", "lm_head")),
    }


@pytest.fixture(scope="module")
def lora_stack(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    stack = start_stack(
        tiny_model_dir,
        tmp_path_factory.mktemp("logs") / "lora-stack.log",
        *("--dtype", "float32", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16"),
        *("--lora-modules", f"sql={adapters['sql']}"),
    )
    yield stack
    stack.stop()


def generate(stack: Stack, **body: object) -> dict[str, object] | list[dict[str, object]]:
    reply = httpx.post(f"{stack.base_url}/generate", json={"sampling_params": GREEDY, **body}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def test_models_lists_adapters_with_their_parent(lora_stack: Stack, adapters: dict[str, Path]) -> None:
    cards = httpx.get(f"{lora_stack.base_url}/v1/models").json()["data"]
    base, sql = cards
    assert base["parent"] is None
    assert (sql["id"], sql["parent"], sql["root"]) == ("sql", base["id"], str(adapters["sql"]))
    assert httpx.get(f"{lora_stack.base_url}/v1/models/sql").json()["parent"] == base["id"]


def test_adapter_by_model_and_by_lora_path_equals_peft_merged(
    lora_stack: Stack, adapters: dict[str, Path], tiny_model_dir: Path
) -> None:
    expected = hf_greedy(merged_reference(tiny_model_dir, adapters["sql"]), PROMPT, max_new=8)
    by_path = generate(lora_stack, input_ids=PROMPT, lora_path="sql")
    assert by_path["output_ids"] == expected  # type: ignore[index,call-overload]
    completion = httpx.post(
        f"{lora_stack.base_url}/v1/completions",
        json={"model": "sql", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True},
        timeout=120,
    ).json()
    assert completion["model"] == "sql"
    assert completion["choices"][0]["text"] == by_path["text"]  # type: ignore[index,call-overload]
    base = generate(lora_stack, input_ids=PROMPT)
    assert base["output_ids"] != expected  # type: ignore[index,call-overload]
    # An adapter tokenizes as its base model.
    tokens = httpx.post(f"{lora_stack.base_url}/tokenize", json={"model": "sql", "prompt": "Hello there"}).json()
    assert tokens["tokens"] and tokens["max_model_len"] == 4096


def test_lora_path_one_per_prompt_in_a_batch(lora_stack: Stack) -> None:
    alone = [generate(lora_stack, input_ids=PROMPT, lora_path=name) for name in ("sql", None)]
    batch = generate(lora_stack, input_ids=[PROMPT, PROMPT], lora_path=["sql", None])
    assert [r["output_ids"] for r in batch] == [r["output_ids"] for r in alone]  # type: ignore[index,call-overload,union-attr]


def test_same_prompt_under_another_adapter_is_no_cache_hit(lora_stack: Stack) -> None:
    prompt = [2000 + i for i in range(20)]  # one full block of 16 to share
    cached = [generate(lora_stack, input_ids=prompt, lora_path=name)["meta_info"]["cached_tokens"]  # type: ignore[call-overload,index]
              for name in ("sql", None, "sql", None)]  # fmt: skip
    assert cached == [0, 0, 16, 16]


def test_load_and_unload_need_the_admin_key_and_change_what_is_served(
    lora_stack: Stack, adapters: dict[str, Path]
) -> None:
    base_url = lora_stack.base_url
    body = {"lora_name": "chat", "lora_path": str(adapters["chat"])}
    assert httpx.post(f"{base_url}/v1/load_lora_adapter", json=body, timeout=60).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx.post(f"{base_url}/v1/load_lora_adapter", json=body, headers=wrong, timeout=60).status_code == 401
    loaded = httpx.post(f"{base_url}/v1/load_lora_adapter", json=body, headers=ADMIN, timeout=60)
    assert loaded.status_code == 200, loaded.text
    assert "chat" in [card["id"] for card in httpx.get(f"{base_url}/v1/models").json()["data"]]
    chat = generate(lora_stack, input_ids=PROMPT, lora_path="chat")
    by_model = httpx.post(
        f"{base_url}/v1/completions",
        json={"model": "chat", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True},
        timeout=120,
    )
    assert by_model.json()["choices"][0]["text"] == chat["text"]  # type: ignore[call-overload]
    unload = {"lora_name": "chat"}
    assert httpx.post(f"{base_url}/v1/unload_lora_adapter", json=unload, timeout=60).status_code == 401
    unloaded = httpx.post(f"{base_url}/v1/unload_lora_adapter", json=unload, headers=ADMIN, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    assert "chat" not in [card["id"] for card in httpx.get(f"{base_url}/v1/models").json()["data"]]
    gone = httpx.post(
        f"{base_url}/v1/completions", json={"model": "chat", "prompt": PROMPT, "max_tokens": 2}, timeout=60
    )
    assert gone.status_code == 404, gone.text
    refused = httpx.post(
        f"{base_url}/generate", json={"input_ids": PROMPT, "lora_path": "chat", "sampling_params": GREEDY}, timeout=60
    )
    assert refused.status_code == 400 and "unknown LoRA adapter 'chat' (loaded: sql)" in refused.text


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"lora_name": "wide", "lora_path": "{wide}"}, "rank 32 is over the limit of 16 (raise --max-lora-rank)"),
        ({"lora_name": "head", "lora_path": "{head}"}, "target modules lm_head are not supported"),
        ({"lora_name": "sql", "lora_path": "{chat}"}, "LoRA adapter 'sql' is already loaded"),
        ({"lora_name": "nowhere", "lora_path": "/no/such/folder"}, "no adapter_config.json there"),
    ],
)
def test_adapters_we_cannot_serve_are_a_400_naming_the_problem(
    lora_stack: Stack, adapters: dict[str, Path], body: dict[str, str], problem: str
) -> None:
    filled = {key: value.format(**{name: str(path) for name, path in adapters.items()}) for key, value in body.items()}
    reply = httpx.post(f"{lora_stack.base_url}/v1/load_lora_adapter", json=filled, headers=ADMIN, timeout=60)
    assert reply.status_code == 400 and problem in reply.text, reply.text


def test_unknown_adapters_are_refused(lora_stack: Stack) -> None:
    reply = httpx.post(
        f"{lora_stack.base_url}/v1/unload_lora_adapter", json={"lora_name": "never"}, headers=ADMIN, timeout=60
    )
    assert reply.status_code == 400 and "LoRA adapter 'never' is not loaded" in reply.text
    unknown = httpx.post(
        f"{lora_stack.base_url}/generate",
        json={"input_ids": PROMPT, "lora_path": "/some/path", "sampling_params": GREEDY},
        timeout=60,
    )
    assert unknown.status_code == 400 and "unknown LoRA adapter '/some/path'" in unknown.text
