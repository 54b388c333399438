"""Engine settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from turnout.security import ServiceSecurity
from turnout.telemetry.metrics_http import check_metrics_port

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
POLICIES = ("fcfs", "priority")
SAMPLING_DEFAULTS = ("model", "openai")
LOGPROBS_MODES = ("processed", "raw")
DEFAULT_CUDA_GRAPH_MAX_BS = 256
ATTENTION_BACKENDS = ("auto", "torch", "triton", "cpu")
SAMPLING_BACKENDS = ("auto", "torch", "triton")
DISTRIBUTED_BACKENDS = ("auto", "gloo", "nccl")
# vLLM's name for the CPU KV pool in GiB, honoured as an alias of --kv-cache-memory (0: unset, as in vLLM).
KV_CACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def kv_cache_memory_from_env(flag_value: float | None, environ: Mapping[str, str]) -> float | None:
    """--kv-cache-memory when given, else VLLM_CPU_KVCACHE_SPACE. The engine's only read of the environment."""
    if flag_value is not None:
        return flag_value
    raw = environ.get(KV_CACHE_SPACE_ENV, "").strip()
    if not raw:
        return None
    try:
        gib = float(raw)
    except ValueError:
        raise ValueError(f"{KV_CACHE_SPACE_ENV} must be a number of GiB, got {raw!r}") from None
    return gib if gib != 0 else None


def _limit(default: float, help_text: str) -> Any:
    """A bound on the work one request may cause. Its flag (`--field-name`, on `turnout engine` and
    `turnout serve`), its check (> 0) and the docs' Limits table all come from this declaration."""
    return field(default=default, metadata={"limit": help_text})


@dataclass(frozen=True)
class EngineConfig:
    model: Path
    # Name clients use in `model`; defaults to the model folder's name.
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 50051
    device: str = "auto"
    dtype: str = "auto"
    # Paged attention implementation: `auto` is triton on CUDA; on CPU the C++ decode kernel (`cpu`)
    # when it builds and serves the dtype, else torch.
    attention_backend: str = "auto"
    # The sampler's final draw for batches without seeded rows: `auto` is the fused Triton kernel on
    # CUDA, torch on CPU (SGLang's --sampling-backend).
    sampling_backend: str = "auto"
    # Cap on prompt + output tokens; defaults to the model's own context length.
    max_model_len: int | None = None
    # Requests allowed to wait for their turn before new ones are refused (RESOURCE_EXHAUSTED).
    max_waiting_requests: int = 1024
    # KV cache: tokens per block, and its size as a block count or a memory budget (GiB; also read
    # from VLLM_CPU_KVCACHE_SPACE). Neither given: on CUDA what a profiling pass leaves of
    # gpu_memory_utilization of the device, on CPU 4 GiB at most a tenth of total RAM (see kv_cache_sizing).
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_gib: float | None = None
    # Share of the CUDA device's total memory this engine may use, its KV pool included (vLLM's meaning).
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    # Scheduler: tokens computed per step (prefill chunks share it with decodes) and running requests.
    max_num_batched_tokens: int = 2048
    max_running_requests: int = 256
    scheduling_policy: str = "fcfs"
    # Sampling: `model` takes unset parameters from generation_config.json, `openai` ignores it.
    sampling_defaults: str = "model"
    # Most alternatives per position a request may ask for (logprobs / top_logprobs / prompt_logprobs).
    max_logprobs: int = 20
    # `processed`: log-probabilities of the distribution sampled from (after bias, penalties and
    # temperature); `raw`: of the model's logits.
    logprobs_mode: str = "processed"
    # Structured outputs: longest whitespace run a JSON constraint allows between tokens, so a small
    # model cannot loop on newlines forever (a request's disable_any_whitespace allows none).
    grammar_max_whitespace: int = 4
    # The thinking budget's tags, looked up in the model's vocabulary.
    think_start_token: str = "<think>"
    think_end_token: str = "</think>"
    # Bounded work per request: a request over one of these is refused (INVALID_ARGUMENT, HTTP 400)
    # with a message naming the field, the limit and its flag, before anything is allocated for it.
    max_n: int = _limit(128, "most samples one request may ask for, n and best_of alike (OpenAI allows 128)")
    max_stop_sequences: int = _limit(64, "most stop strings and stop regexes one request may give, together")
    max_stop_sequence_length: int = _limit(1024, "longest stop string or stop regex, in characters")
    max_grammar_bytes: int = _limit(
        1 << 20, "largest structured-output constraint (JSON schema, regex, EBNF, structural tag), in UTF-8 bytes"
    )
    max_grammar_depth: int = _limit(
        64, "deepest nesting of a JSON schema or structural tag (objects and arrays of its JSON text)"
    )
    grammar_compile_timeout: float = _limit(
        10.0, "seconds one grammar may take to compile; a slower one is refused and its worker replaced"
    )
    # Accept custom logits processors serialized by clients: runs client code, trusted clients only.
    enable_custom_logit_processor: bool = False
    # Postprocess each step on the CPU while the device runs the next one (llm_engine.py). None: on
    # for CUDA devices, off on CPU, where nothing runs asynchronously.
    overlap_schedule: bool | None = None
    # Port of the Prometheus /metrics HTTP endpoint (None: not served).
    metrics_port: int | None = None
    # Who may call this service, and TLS (turnout/security.py; the CLI refuses to start without a token).
    security: ServiceSecurity = field(default_factory=ServiceSecurity)
    # CUDA graphs for decode-only batches (CUDA and a graph-safe attention backend only), captured for
    # batch sizes up to cuda_graph_max_bs (None: see cuda_graph_batch_limit).
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    # Longest sequence a replayed decode step may hold: the graphs' block tables are this wide, and
    # the split-K decode grid grows with them (a batch holding a longer sequence runs eagerly).
    cuda_graph_max_seq_len: int = 8192
    # Tensor parallelism (vLLM --tensor-parallel-size, SGLang --tp-size): the model split over this
    # many ranks, each a process with its own device (CUDA: cuda:0 .. N-1) and its share of the heads,
    # MLP rows, vocabulary and KV cache; rank 0 schedules and serves (services/engine/parallel/).
    tensor_parallel_size: int = 1
    # torch.distributed backend of the ranks: `auto` is NCCL on CUDA, gloo on CPU.
    distributed_backend: str = "auto"
    # LoRA adapters (vLLM's flags; services/engine/lora/): served at all, those loaded at start
    # (name, PEFT folder), how many may be on the device at once (the most a step can mix), and the
    # highest rank accepted (every slot is sized for it).
    enable_lora: bool = False
    lora_modules: tuple[tuple[str, Path], ...] = ()
    max_loras: int = 1
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        if not (self.model / "config.json").is_file():
            raise ValueError(f"--model {self.model}: no config.json there (expected a Hugging Face model folder)")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention_backend!r}"
            )
        if self.sampling_backend not in SAMPLING_BACKENDS:
            raise ValueError(
                f"--sampling-backend must be one of {', '.join(SAMPLING_BACKENDS)}, got {self.sampling_backend!r}"
            )
        if self.distributed_backend not in DISTRIBUTED_BACKENDS:
            raise ValueError(
                f"--distributed-backend must be one of {', '.join(DISTRIBUTED_BACKENDS)}, "
                f"got {self.distributed_backend!r}"
            )
        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"--scheduling-policy must be one of {', '.join(POLICIES)}")
        if self.sampling_defaults not in SAMPLING_DEFAULTS:
            raise ValueError(f"--sampling-defaults must be one of {', '.join(SAMPLING_DEFAULTS)}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"--logprobs-mode must be one of {', '.join(LOGPROBS_MODES)}")
        if self.max_logprobs < 0:
            raise ValueError(f"--max-logprobs must be >= 0, got {self.max_logprobs}")
        positive = {
            "--max-model-len": self.max_model_len,
            "--block-size": self.block_size,
            "--num-kv-blocks": self.num_kv_blocks,
            "--max-num-batched-tokens": self.max_num_batched_tokens,
            "--max-running-requests": self.max_running_requests,
            "--grammar-max-whitespace": self.grammar_max_whitespace,
            "--cuda-graph-max-bs": self.cuda_graph_max_bs,
            "--cuda-graph-max-seq-len": self.cuda_graph_max_seq_len,
            "--tensor-parallel-size": self.tensor_parallel_size,
        }
        positive.update({limit_flag(f): getattr(self, f.name) for f in request_limit_fields()})
        for flag, value in positive.items():
            if value is not None and not value > 0:
                raise ValueError(f"{flag} must be positive, got {value}")
        if self.kv_cache_memory_gib is not None and not self.kv_cache_memory_gib > 0:
            raise ValueError(f"--kv-cache-memory must be positive, got {self.kv_cache_memory_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not self.think_start_token or not self.think_end_token:
            raise ValueError("--think-start-token and --think-end-token must not be empty")
        if self.max_waiting_requests < 0:
            raise ValueError("--max-waiting-requests must be >= 0")
        check_metrics_port(self.metrics_port)
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError(
                f"--max-loras and --max-lora-rank must be >= 1, got {self.max_loras}, {self.max_lora_rank}"
            )
        if self.lora_modules and not self.enable_lora:
            raise ValueError("--lora-modules needs --enable-lora")
        if self.enable_lora and self.tensor_parallel_size > 1:
            # The row-parallel projections' LoRA terms would need sharding and the all-reduce too; not done yet.
            raise ValueError("--enable-lora cannot be combined with --tensor-parallel-size > 1 yet")
        names = [name for name, _ in self.lora_modules]
        if len(set(names)) != len(names):
            raise ValueError(f"--lora-modules names must be unique, got {', '.join(names)}")

    @property
    def cuda_graph_batch_limit(self) -> int:
        """Largest decode batch replayed from a CUDA graph. By default the running cap, at most 256
        (vLLM's and SGLang's usual largest sizes lie between 256 and 512: beyond that a decode step is
        long enough that launch overhead hardly shows). Never above the step's token budget, which
        no decode batch can exceed."""
        wanted = self.cuda_graph_max_bs or min(self.max_running_requests, DEFAULT_CUDA_GRAPH_MAX_BS)
        return min(wanted, self.max_num_batched_tokens)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.resolve().name

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_lora_module(text: str) -> tuple[str, Path]:
    """One --lora-modules entry, `name=path` (vLLM's form)."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--lora-modules entries are name=path, got {text!r}")
    return name.strip(), Path(path.strip())


def request_limit_fields() -> tuple[Field[Any], ...]:
    """The EngineConfig fields that bound one request's work (declared with `_limit`)."""
    return tuple(f for f in fields(EngineConfig) if "limit" in f.metadata)


def limit_flag(limit: Field[Any]) -> str:
    return "--" + limit.name.replace("_", "-")


def add_limit_flags(parser: argparse.ArgumentParser, *, forwarded: bool = False) -> None:
    """One flag per request limit. `forwarded` (turnout serve): unset by default, so the engine's own
    default applies, and the help says which service takes it."""
    group = parser.add_argument_group("per-request limits (a request over one is refused with a 400)")
    for limit in request_limit_fields():
        help_text = f"{limit.metadata['limit']} (default: {limit.default})"
        group.add_argument(
            limit_flag(limit),
            dest=limit.name,
            type=type(limit.default),
            default=None if forwarded else limit.default,
            metavar=type(limit.default).__name__.upper(),
            help=f"engine: {help_text}" if forwarded else help_text,
        )
