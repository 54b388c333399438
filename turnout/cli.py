"""The `turnout` command: run one service, the whole stack, or a helper task.

Each subcommand's flags are defined next to the service it runs
(`services/*/main.py`, `gateway/main.py`); this module only wires them up, and
imports a service's heavy dependencies only when that service runs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import NoReturn

from turnout.flag_parser import FlagParser

# subcommand -> (module with build_parser() and run(args), one-line help)
COMMANDS = {
    "serve": ("turnout.launcher", "run engine, tokenizer, router and gateway on this machine"),
    "engine": ("services.engine.main", "serve a model over the Engine gRPC service"),
    "tokenizer": ("services.tokenizer.main", "serve a tokenizer over the Tokenizer gRPC service"),
    "router": ("services.router.main", "serve the public Inference gRPC service"),
    "gateway": ("gateway.main", "serve the OpenAI-compatible and SGLang-native HTTP API"),
    "prepare-model": ("turnout.default_model", "convert the default model once and print its folder"),
    "health": ("turnout.health_check", "check a gRPC service's health (exit 0 when SERVING)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnout", description="Turnout: LLM serving over gRPC services.", allow_abbrev=False
    )
    # Each command's parser reads --config and TURNOUT_* too (turnout/flags.py).
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=FlagParser)
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=help_text)
        module.build_parser(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> None:
    from turnout.grpc_transport import use_posix_endpoints

    use_posix_endpoints()  # before anything imports grpc
    from turnout.child_processes import die_with_launcher
    from turnout.event_loop import install_event_loop_policy

    die_with_launcher()
    install_event_loop_policy()
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    code = args.run(args)
    exit_now(code if isinstance(code, int) else 0)


def exit_now(code: int) -> NoReturn:
    """End the process once its command has returned, skipping the interpreter's teardown.

    The command has stopped its servers and drained its work; what is left is tearing down the
    heap of torch, transformers and gRPC (a full garbage collection of every module), which took
    3 to 9 s on a busy machine: past the launcher's grace, so engine and tokenizer were SIGKILLed
    on every stop. A thread still blocked in C (a grammar compile) would hold the exit longer still.
    Spans still queued and log handlers are flushed first.
    """
    from turnout.telemetry.tracing import shutdown_tracing

    shutdown_tracing()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
