"""Every flag declared once (turnout/flags.py): vLLM/SGLang spellings, `turnout serve` forwarding,
--config YAML, TURNOUT_* variables and refusals, all through the real parsers."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway import main as gateway_main
from services.engine import main as engine_main
from services.router import main as router_main
from services.tokenizer import main as tokenizer_main
from turnout import launcher
from turnout.flags import Declared, to_argv
from turnout.security import API_KEY_ENV, stack_environment
from turnout.serve_flags import CHILDREN, ChildFlags

# The arguments each service's parser needs besides the ones under test.
PARSERS: dict[str, tuple[Callable[[], argparse.ArgumentParser], list[str]]] = {
    "engine": (engine_main.build_parser, ["--model", "/m"]),
    "tokenizer": (tokenizer_main.build_parser, ["--model", "/m"]),
    "router": (router_main.build_parser, ["--tokenizer", "t:1"]),
    "gateway": (gateway_main.build_parser, ["--router", "r:1"]),
}


def parse(service: str, argv: list[str]) -> argparse.Namespace:
    build, needed = PARSERS[service]
    return build().parse_args([*needed, *argv])


def child_args(serve_argv: list[str], service: str) -> argparse.Namespace:
    """What `turnout serve ARGV` gives the first child of that kind, read back by its own parser."""
    args = launcher.build_parser().parse_args(["--model", "/m", *serve_argv])
    stack = launcher.build_stack(args, Path("/m"))
    child = next(c for c in stack.children if c.name.startswith(service))
    return PARSERS[service][0]().parse_args(child.argv[child.argv.index(service) + 1 :])


# (service, argv, field it sets, value): vLLM's and SGLang's spellings and ours.
ALIASES: list[tuple[str, list[str], str, Any]] = [
    ("engine", ["--max-num-seqs", "8"], "max_running_requests", 8),
    ("engine", ["--lora-paths", "sql=/a/sql"], "lora_modules", [("sql", Path("/a/sql"))]),
    ("engine", ["--max-loras-per-batch", "4"], "max_loras", 4),
    ("engine", ["--max-running-requests", "8"], "max_running_requests", 8),
    ("engine", ["--max-num-batched-tokens", "512"], "max_num_batched_tokens", 512),
    ("engine", ["--chunked-prefill-size", "512"], "max_num_batched_tokens", 512),
    ("engine", ["--context-length", "1024"], "max_model_len", 1024),
    ("engine", ["--max-model-len", "1024"], "max_model_len", 1024),
    ("engine", ["--no-enable-prefix-caching"], "enable_prefix_caching", False),
    ("engine", ["--disable-radix-cache"], "enable_prefix_caching", False),
    ("engine", ["--no-prefix-caching"], "enable_prefix_caching", False),
    ("engine", ["--no-prefix-caching", "--enable-prefix-caching"], "enable_prefix_caching", True),
    ("engine", ["--tensor-parallel-size", "1"], "tensor_parallel_size", 1),
    ("engine", ["--tp-size", "2"], "tensor_parallel_size", 2),
    ("engine", ["--distributed-backend", "gloo"], "distributed_backend", "gloo"),
    ("engine", ["--seed", "7"], "seed", 7),
    ("engine", ["--random-seed", "7"], "seed", 7),
    ("engine", ["--generation-config", "auto"], "sampling_defaults", "model"),
    ("engine", ["--generation-config", "vllm"], "sampling_defaults", "openai"),
    ("engine", ["--generation-config", "/gen"], "sampling_defaults", "/gen"),
    (
        "engine",
        ["--override-generation-config", '{"temperature": 0.5}'],
        "override_generation_config",
        {"temperature": 0.5},
    ),
    ("engine", ["--enforce-eager"], "disable_cuda_graph", True),
    ("engine", ["--disable-cuda-graph"], "disable_cuda_graph", True),
    ("engine", ["--kv-cache-dtype", "auto"], "kv_cache_dtype", "auto"),
    ("engine", ["--trust-remote-code"], "trust_remote_code", True),
    ("engine", ["--max-logprobs", "5"], "max_logprobs", 5),
    ("engine", ["--gpu-memory-utilization", "0.5"], "gpu_memory_utilization", 0.5),
    ("engine", ["--mem-fraction-static", "0.5"], "gpu_memory_utilization", 0.5),
    ("engine", ["--dtype", "half"], "dtype", "float16"),
    ("engine", ["--dtype", "float"], "dtype", "float32"),
    ("engine", ["--schedule-policy", "priority"], "scheduling_policy", "priority"),
    ("tokenizer", ["--tool-call-parser", "hermes"], "tool_call_parser", "hermes"),
    ("tokenizer", ["--tool-call-parser", "llama3"], "tool_call_parser", "llama3_json"),
    ("tokenizer", ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], "enable_auto_tool_choice", True),
    ("tokenizer", ["--reasoning-parser", "deepseek_r1"], "reasoning_parser", "deepseek-r1"),
    ("tokenizer", ["--chat-template-content-format", "openai"], "chat_template_content_format", "openai"),
    ("tokenizer", ["--chat-template", "{{ x }}"], "chat_template", "{{ x }}"),
    ("router", ["--policy", "round_robin"], "policy", "round_robin"),
    ("gateway", ["--served-model-name", "a", "org/b"], "served_model_names", ["a", "org/b"]),
    ("gateway", ["--uvicorn-log-level", "debug"], "uvicorn_log_level", "debug"),
    ("gateway", ["--enable-log-requests"], "enable_log_requests", True),
    ("gateway", ["--log-requests"], "enable_log_requests", True),
    ("gateway", ["--enable-log-requests", "--disable-log-requests"], "enable_log_requests", False),
    ("gateway", ["--return-tokens-as-token-ids"], "return_tokens_as_token_ids", True),
    ("gateway", ["--response-role", "model"], "response_role", "model"),
    ("gateway", ["--port", "9000"], "port", 9000),
]


@pytest.mark.parametrize(("service", "argv", "field", "value"), ALIASES, ids=[" ".join(a[1]) for a in ALIASES])
def test_each_spelling_sets_its_field_on_the_service_and_through_turnout_serve(
    service: str, argv: list[str], field: str, value: Any
) -> None:
    assert getattr(parse(service, argv), field) == value
    assert getattr(child_args(argv, service), field) == value


# Spellings only `turnout serve` takes (vLLM's `serve`, SGLang's `launch_server`).
SERVE_ALIASES: list[tuple[list[str], str, Any]] = [
    (["--data-parallel-size", "2"], "engines", 2),
    (["--dp-size", "2"], "engines", 2),
    (["--enable-metrics"], "metrics", True),
    (["--model-path", "/m"], "model", "/m"),
    (["/m"], "model", "/m"),
    (["--tokenizer", "/tok"], "tokenizer", "/tok"),
    (["--tokenizer-path", "/tok"], "tokenizer", "/tok"),
    (["--revision", "v1"], "revision", "v1"),
    (["--download-dir", "/d"], "download_dir", "/d"),
]


@pytest.mark.parametrize(("argv", "field", "value"), SERVE_ALIASES, ids=[" ".join(a[0]) for a in SERVE_ALIASES])
def test_serve_spellings(argv: list[str], field: str, value: Any) -> None:
    assert getattr(launcher.build_parser().parse_args(argv), field) == value


def test_the_tokenizer_folder_reaches_the_tokenizer_and_the_router_keeps_its_address() -> None:
    args = launcher.build_parser().parse_args(["/m", "--tokenizer", "/tok"])
    assert (args.model, args.tokenizer, args.tokenizer_port) == ("/m", "/tok", 0)  # not --tokenizer-port
    stack = launcher.build_stack(args, Path(args.model), Path(args.tokenizer))  # run() resolves both first
    tokenizer = next(c for c in stack.children if c.name == "tokenizer")
    assert tokenizer_main.build_parser().parse_args(tokenizer.argv[4:]).tokenizer == Path("/tok")
    router = next(c for c in stack.children if c.name == "router")
    assert router_main.build_parser().parse_args(router.argv[4:]).tokenizers[0].startswith("127.0.0.1:")


def sample_value(d: Declared) -> Any:
    """A value of `d` other than its default, or None when the flag accepts none (a refusal)."""
    if d.kind is bool:
        return not d.default if d.default is not None else True
    if d.spec.choices is not None:
        return next(c for c in d.spec.choices if c != d.default)
    candidates: dict[type, Callable[[], Any]] = {
        int: lambda: (d.default or 0) + 3,
        float: lambda: (d.default or 0.0) + 0.25,
        str: lambda: "x-value",
        Path: lambda: Path("/some/where"),
        dict: lambda: {"temperature": 0.5},
        tuple: lambda: ("a", "b"),
    }
    value = candidates[d.kind]()
    if d.kind is tuple and d.spec.parse is not None and d.default == ():  # a list in one word (--cpu-cores 0-1)
        with contextlib.suppress(argparse.ArgumentTypeError):
            return d.read("0-1")
    if d.kind is tuple and d.spec.item is not None:  # elements read from words (--lora-modules NAME=PATH)
        try:
            return (d.read("a=/some/where"),)
        except argparse.ArgumentTypeError:
            return None
    try:
        d.read(str(value) if d.kind is not dict else '{"temperature": 0.5}')
    except argparse.ArgumentTypeError:
        return None
    return value


@pytest.mark.parametrize("child", CHILDREN, ids=[c.service for c in CHILDREN])
def test_every_flag_of_every_service_reaches_its_child_from_turnout_serve(child: ChildFlags) -> None:
    serve = launcher.build_parser()
    own_parser = PARSERS[child.service][0]()
    refused = []
    for d in child.flags():
        value = sample_value(d)
        if value is None:
            refused.append(d.flag)
            continue
        argv = to_argv(d, value)
        assert argv[0] in own_parser._option_string_actions, f"{d.flag} is not a flag of turnout {child.service}"
        landed = getattr(child_args(argv, child.service), d.field)
        assert (tuple(landed) if isinstance(landed, list) else landed) == value, d.flag
    # What cannot take another value is refused by name (see the refusal tests).
    assert set(refused) <= {"--pipeline-parallel-size", "--kv-cache-dtype"}
    # And nothing of the child's own parser is missing from `turnout serve` (bar what the launcher sets).
    set_by_launcher = {"--model", "--host", "--port", "--served-model-name", "--engine", "--router"}
    set_by_launcher |= {"--tokenizer", "--tokenizer-path", "--metrics-port"}
    missing = set(own_parser._option_string_actions) - set(serve._option_string_actions) - set_by_launcher
    assert missing == set()


def test_config_file_both_spellings_and_the_command_line_wins(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "max-num-seqs: 8\n"  # vLLM's spelling, dashes
        "max_model_len: 512\n"  # underscores
        "enable-prefix-caching: false\n"
        "served-model-name: [a, b]\n"
        "override-generation-config: {temperature: 0.5}\n"
        "api-key: [k1, k2]\n"
        "tokenizer: /tok\n"
    )
    args = launcher.build_parser().parse_args(["/m", "--config", str(config), "--max-model-len", "256"])
    assert (args.max_running_requests, args.max_model_len, args.enable_prefix_caching) == (8, 256, False)
    assert list(args.served_model_names) == ["a", "b"] and args.override_generation_config == {"temperature": 0.5}
    assert (list(args.api_key), args.tokenizer, args.model) == (["k1", "k2"], "/tok", "/m")
    # A repeated flag on the command line replaces the file's list instead of adding to it.
    again = launcher.build_parser().parse_args(["--config", str(config), "--api-key", "k3"])
    assert again.api_key == ["k3"]
    # The engine reads the same file (its own flags only are asked of it).
    engine_file = tmp_path / "engine.yaml"
    engine_file.write_text("model: /m\nmax-num-seqs: 4\ndisable-radix-cache: true\n")
    engine = engine_main.build_parser().parse_args(["--config", str(engine_file)])
    assert (engine.model, engine.max_running_requests, engine.enable_prefix_caching) == (Path("/m"), 4, False)


def test_a_config_file_with_an_unknown_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("max-num-seqs: 8\nno-such-flag: 1\n")
    with pytest.raises(SystemExit) as stop:
        launcher.build_parser().parse_args(["--config", str(config)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "no-such-flag" in err and str(config) in err and len(err.splitlines()) == 1


def test_environment_between_file_and_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("max-model-len: 512\nmax-running-requests: 8\n")
    monkeypatch.setenv("TURNOUT_MAX_MODEL_LEN", "384")
    monkeypatch.setenv("TURNOUT_ENABLE_PREFIX_CACHING", "false")
    monkeypatch.setenv("TURNOUT_SERVED_MODEL_NAME", "a b")
    monkeypatch.setenv(API_KEY_ENV, "k1\nk2")  # one a line, as turnout serve hands them to its children
    parser = launcher.build_parser()
    args = parser.parse_args(["--config", str(config)])
    assert (args.max_model_len, args.max_running_requests, args.enable_prefix_caching) == (384, 8, False)
    assert (list(args.served_model_names), list(args.api_key)) == (["a", "b"], ["k1", "k2"])
    assert launcher.build_parser().parse_args(["--config", str(config), "--max-model-len", "256"]).max_model_len == 256
    monkeypatch.setenv("TURNOUT_MAX_MODEL_LEN", "many")
    with pytest.raises(SystemExit) as stop:
        launcher.build_parser().parse_args([])
    assert stop.value.code == 2


def test_a_required_flag_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit):
        engine_main.build_parser().parse_args([])
    monkeypatch.setenv("TURNOUT_MODEL", "/m")
    assert engine_main.build_parser().parse_args([]).model == Path("/m")


REFUSED = [
    (["--pipeline-parallel-size", "2"], "pipeline parallelism is not implemented"),
    (["--kv-cache-dtype", "fp8"], "quantized KV caches are not implemented"),
]


@pytest.mark.parametrize(("argv", "message"), REFUSED, ids=[" ".join(r[0]) for r in REFUSED])
@pytest.mark.parametrize("cli", ["serve", "engine"])
def test_capabilities_we_lack_are_refused_in_one_line(
    cli: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        if cli == "serve":
            launcher.build_parser().parse_args(argv)
        else:
            parse("engine", argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and argv[0] in err and len(err.splitlines()) == 1


def test_api_key_twice_keeps_both_on_every_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--api-key", "a", "--api-key", "b"]
    assert parse("gateway", argv).api_key == ["a", "b"]
    serve = launcher.build_parser().parse_args(argv)
    env = stack_environment(serve)
    assert env[API_KEY_ENV] == "a\nb"
    # The gateway child reads them from the environment turnout serve gives it.
    monkeypatch.setenv(API_KEY_ENV, env[API_KEY_ENV])
    config = gateway_main.config_from_args(parse("gateway", ["--insecure-internal"]))
    assert config.security.api_keys == ("a", "b")


def test_no_abbreviations(capsys: pytest.CaptureFixture[str]) -> None:
    for build, argv in [(launcher.build_parser, ["--tokenizer-p", "5"]), (PARSERS["engine"][0], ["--max-num", "8"])]:
        with pytest.raises(SystemExit) as stop:
            build().parse_args(argv)
        assert stop.value.code == 2


def test_positional_model_and_model_flag(capsys: pytest.CaptureFixture[str]) -> None:
    parser = launcher.build_parser
    assert parser().parse_args(["/m", "--model", "/m"]).model == "/m"
    assert parser().parse_args([]).model is None
    with pytest.raises(SystemExit) as stop:
        parser().parse_args(["/m", "--model", "/n"])
    assert stop.value.code == 2 and "disagree" in capsys.readouterr().err
