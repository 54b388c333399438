"""`turnout serve` passes the HTTP options on to the gateway (no processes are started here)."""

from __future__ import annotations

from pathlib import Path

from gateway.main import config_from_args
from gateway.main import parse_args as gateway_args
from turnout import launcher


def test_http_flags_reach_the_gateway_and_the_engine_serves_the_first_name() -> None:
    argv = ["--model", "/m", "--served-model-name", "a", "org/b", "--root-path", "/llm", "--max-request-bytes", "99"]
    argv += ["--allowed-origins", '["https://x.example"]', "--allow-credentials", "--api-key", "secret"]
    stack = launcher.build_stack(launcher.build_parser().parse_args(argv), Path("/m"))
    engine, gateway = stack.children[0], stack.children[-1]
    assert engine.argv[engine.argv.index("--served-model-name") + 1 :] == ["a"]
    # The gateway's own parser reads what the launcher wrote.
    config = config_from_args(gateway_args(gateway.argv[gateway.argv.index("gateway") + 1 :]))
    assert config.served_model_names == ("a", "org/b")
    assert config.root_path == "/llm" and config.max_request_bytes == 99
    assert config.allowed_origins == ("https://x.example",) and config.allow_credentials
    # The key travels in the environment (set by `run`), never on a command line.
    assert "secret" not in " ".join(c for child in stack.children for c in child.argv)


def test_generation_flags_reach_every_engine() -> None:
    from services.engine.main import build_parser as engine_parser

    argv = ["--model", "/m", "--engines", "2", "--grammar-max-whitespace", "2", "--enable-custom-logit-processor"]
    argv += ["--think-start-token", "<reason>", "--think-end-token", "</reason>", "--max-model-len", "512"]
    argv += ["--attention-backend", "torch", "--sampling-backend", "torch", "--disable-overlap-schedule"]
    stack = launcher.build_stack(launcher.build_parser().parse_args(argv), Path("/m"))
    engines = [child for child in stack.children if child.name.startswith("engine")]
    assert len(engines) == 2
    for engine in engines:
        args = engine_parser().parse_args(engine.argv[engine.argv.index("engine") + 1 :])
        assert args.grammar_max_whitespace == 2 and args.enable_custom_logit_processor
        assert (args.think_start_token, args.think_end_token) == ("<reason>", "</reason>")
        assert args.max_model_len == 512
        assert args.attention_backend == "torch" and args.sampling_backend == "torch"
        assert args.overlap_schedule is False
    plain = launcher.build_stack(launcher.build_parser().parse_args(["--model", "/m"]), Path("/m")).children[0]
    assert "--enable-custom-logit-processor" not in plain.argv
    assert engine_parser().parse_args(plain.argv[plain.argv.index("engine") + 1 :]).overlap_schedule is None
    forced = launcher.build_parser().parse_args(["--model", "/m", "--enable-overlap-schedule"])
    engine = launcher.build_stack(forced, Path("/m")).children[0]
    assert engine_parser().parse_args(engine.argv[engine.argv.index("engine") + 1 :]).overlap_schedule is True


def test_memory_and_cuda_graph_flags_reach_every_engine() -> None:
    from services.engine.main import build_parser as engine_parser

    argv = ["--model", "/m", "--engines", "2", "--gpu-memory-utilization", "0.7", "--cuda-graph-max-bs", "64"]
    argv += ["--cuda-graph-max-seq-len", "4096"]
    stack = launcher.build_stack(launcher.build_parser().parse_args([*argv, "--disable-cuda-graph"]), Path("/m"))
    engines = [child for child in stack.children if child.name.startswith("engine")]
    assert len(engines) == 2
    for engine in engines:
        args = engine_parser().parse_args(engine.argv[engine.argv.index("engine") + 1 :])
        assert args.gpu_memory_utilization == 0.7 and args.cuda_graph_max_bs == 64 and args.disable_cuda_graph
        assert args.cuda_graph_max_seq_len == 4096
    plain = launcher.build_stack(launcher.build_parser().parse_args(["--model", "/m"]), Path("/m")).children[0]
    args = engine_parser().parse_args(plain.argv[plain.argv.index("engine") + 1 :])
    assert (args.gpu_memory_utilization, args.cuda_graph_max_bs, args.disable_cuda_graph) == (0.9, None, False)
    assert args.cuda_graph_max_seq_len == 8192


def test_lora_flags_reach_every_engine() -> None:
    from services.engine.main import build_parser as engine_parser

    argv = ["--model", "/m", "--engines", "2", "--enable-lora", "--lora-modules", "sql=/a/sql", "chat=/a/chat"]
    argv += ["--max-loras", "4", "--max-lora-rank", "32"]
    stack = launcher.build_stack(launcher.build_parser().parse_args(argv), Path("/m"))
    engines = [child for child in stack.children if child.name.startswith("engine")]
    assert len(engines) == 2
    for engine in engines:
        args = engine_parser().parse_args(engine.argv[engine.argv.index("engine") + 1 :])
        assert args.enable_lora and (args.max_loras, args.max_lora_rank) == (4, 32)
        assert args.lora_modules == [("sql", Path("/a/sql")), ("chat", Path("/a/chat"))]
    plain = launcher.build_stack(launcher.build_parser().parse_args(["--model", "/m"]), Path("/m")).children[0]
    args = engine_parser().parse_args(plain.argv[plain.argv.index("engine") + 1 :])
    assert (args.enable_lora, args.lora_modules, args.max_loras, args.max_lora_rank) == (False, [], 1, 16)
