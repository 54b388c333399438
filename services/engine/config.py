"""Engine settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from turnout.cpu_cores import parse_cpu_list
from turnout.flags import flag, only, spelled
from turnout.security import ServiceSecurity
from turnout.telemetry.metrics_http import check_metrics_port

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
POLICIES = ("fcfs", "priority")
SAMPLING_DEFAULTS = ("model", "openai")
LOGPROBS_MODES = ("processed", "raw")
# The generation_config.json values that become sampling defaults (each a SamplingParams field).
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")
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
    return flag(default, help_text, metadata={"limit": help_text})


NOT_PIPELINE_PARALLEL = "pipeline parallelism is not implemented: an engine serves a model that fits one device"
KV_CACHE_DTYPE_ONLY_AUTO = "the KV cache is kept in the model's dtype ('auto'); quantized KV caches are not implemented"


@dataclass(frozen=True)
class EngineConfig:
    model: Path = flag(help="Hugging Face model folder")
    # Name clients use in `model`; defaults to the model folder's name.
    served_model_name: str | None = flag(None, "name clients use (default: the folder's name)")
    host: str = flag("127.0.0.1", "address the gRPC service listens on")
    port: int = flag(50051, "port the gRPC service listens on")
    device: str = flag("auto", "auto (cuda when there is one), cpu or cuda", choices=DEVICES)
    dtype: str = flag(
        "auto",
        "weights and activations: auto (bfloat16 on CUDA and on a CPU where it beats float32: native bfloat16 "
        "instructions, or AVX2 with the CPU kernels; else float32), float32, bfloat16, float16",
        choices=DTYPES,
        parse=spelled({"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}),
    )
    # The step thread and its OpenMP team on these CPUs, the event loop and gRPC on the others
    # (turnout/cpu_cores.py); empty: the kernel places every thread.
    cpu_cores: tuple[int, ...] = flag(
        (),
        "CPUs for the engine's compute threads (its step and OpenMP team), e.g. 0-3,8; its event loop and gRPC "
        "threads run on the others (default: no binding; `turnout serve --cpu-reserved-cores` sets it per replica)",
        metavar="LIST",
        parse=parse_cpu_list,
    )
    # Paged attention implementation: `auto` is triton on CUDA; on CPU the C++ decode kernel (`cpu`)
    # when it builds and serves the dtype, else torch.
    attention_backend: str = flag(
        "auto",
        "paged attention: auto (triton on CUDA; on CPU the C++ kernel, else torch), torch, triton, or cpu",
        choices=ATTENTION_BACKENDS,
    )
    # The sampler's final draw for batches without seeded rows: `auto` is the fused Triton kernel on
    # CUDA, torch on CPU (SGLang's --sampling-backend).
    sampling_backend: str = flag(
        "auto",
        "the sampler's draw for unseeded batches: auto (triton on CUDA, torch on CPU), torch, or triton",
        choices=SAMPLING_BACKENDS,
    )
    # Cap on prompt + output tokens; defaults to the model's own context length.
    max_model_len: int | None = flag(
        None, "cap on prompt + output tokens (default: the model's context length)", aliases=("--context-length",)
    )
    # Requests allowed to wait for their turn before new ones are refused (RESOURCE_EXHAUSTED).
    max_waiting_requests: int = flag(1024, "requests that may wait for their turn; beyond, new ones get 429")
    # KV cache: tokens per block, and its size as a block count or a memory budget (GiB; also read
    # from VLLM_CPU_KVCACHE_SPACE). Neither given: on CUDA what a profiling pass leaves of
    # gpu_memory_utilization of the device, on CPU 4 GiB at most a tenth of total RAM (see kv_cache_sizing).
    block_size: int = flag(16, "tokens per KV block")
    num_kv_blocks: int | None = flag(None, "KV pool size in blocks (overrides --kv-cache-memory)")
    kv_cache_memory_gib: float | None = flag(
        None,
        f"KV pool size in GiB (or ${KV_CACHE_SPACE_ENV}; default: on CPU 4, at most a tenth of total RAM; "
        "on CUDA what --gpu-memory-utilization leaves)",
        name="--kv-cache-memory",
        metavar="GIB",
    )
    # Share of the CUDA device's total memory this engine may use, its KV pool included (vLLM's meaning).
    gpu_memory_utilization: float = flag(
        0.9,
        "CUDA: share of the device's total memory this engine may use, its KV pool included; the pool gets "
        "what a profiling pass leaves of it (two engines on one GPU: 0.45 each)",
        aliases=("--mem-fraction-static",),
    )
    # Accepted for vLLM's and SGLang's command lines; only the model's own dtype is implemented.
    kv_cache_dtype: str = flag(
        "auto",
        "dtype of the KV cache: auto (the model's); other values are refused",
        parse=only(("auto",), str, KV_CACHE_DTYPE_ONLY_AUTO),
    )
    enable_prefix_caching: bool = flag(
        True,
        "reuse the KV blocks of prompt prefixes seen before",
        negations=("--no-prefix-caching", "--no-enable-prefix-caching", "--disable-radix-cache"),
    )
    # Scheduler: tokens computed per step (prefill chunks share it with decodes) and running requests.
    max_num_batched_tokens: int = flag(
        2048,
        "tokens computed per step; long prompts are prefilled in chunks of it",
        aliases=("--chunked-prefill-size",),
    )
    max_running_requests: int = flag(256, "requests running at once", aliases=("--max-num-seqs",))
    scheduling_policy: str = flag(
        "fcfs", "fcfs, or priority (request field `priority`)", choices=POLICIES, aliases=("--schedule-policy",)
    )
    # Sampling: `model` takes unset parameters from generation_config.json (of the model folder, or
    # of the folder given instead), `openai` ignores it; override_generation_config goes over either.
    sampling_defaults: str = flag(
        "model",
        "where unset sampling parameters come from: model (the model's generation_config.json), openai (the "
        "documented defaults), or a folder holding a generation_config.json; vLLM's auto and vllm are accepted",
        aliases=("--generation-config",),
        metavar="{model,openai,FOLDER}",
        parse=spelled({"auto": "model", "vllm": "openai"}),
    )
    override_generation_config: dict[str, Any] = flag(
        help='JSON object of generation_config.json values that go over the defaults, e.g. {"temperature": 0.5}',
        default_factory=dict,
    )
    # Seeds torch's generator once at start: unseeded requests then draw the same noise from one run to
    # the next (given the same order of requests). Seeded requests use their own generators.
    seed: int | None = flag(None, "seed of the random draws of unseeded requests", aliases=("--random-seed",))
    # Most alternatives per position a request may ask for (logprobs / top_logprobs / prompt_logprobs).
    max_logprobs: int = flag(20, "most alternatives per position a request may ask for")
    # `processed`: log-probabilities of the distribution sampled from (after bias, penalties and
    # temperature); `raw`: of the model's logits.
    logprobs_mode: str = flag(
        "processed",
        "processed: log-probs of the distribution sampled from (after penalties, temperature); raw: of logits",
        choices=LOGPROBS_MODES,
    )
    # Structured outputs: longest whitespace run a JSON constraint allows between tokens, so a small
    # model cannot loop on newlines forever (a request's disable_any_whitespace allows none).
    grammar_max_whitespace: int = flag(
        4, "longest whitespace run JSON constraints allow between tokens (requests may ask for none)"
    )
    # The thinking budget's tags, looked up in the model's vocabulary.
    think_start_token: str = flag("<think>", "the model's thinking start tag")
    think_end_token: str = flag("</think>", "the model's thinking end tag")
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
    enable_custom_logit_processor: bool = flag(
        False, "accept logits processors serialized by clients (runs their code: trusted clients only)"
    )
    # Postprocess each step on the CPU while the device runs the next one (llm_engine.py). None: on
    # for CUDA devices, off on CPU, where nothing runs asynchronously.
    overlap_schedule: bool | None = flag(
        None,
        "postprocess each step while the device runs the next (default: on for CUDA, off on CPU); "
        "--disable-overlap-schedule: postprocess each step before scheduling the next",
        name="--enable-overlap-schedule",
        negations=("--disable-overlap-schedule",),
    )
    # Tensor parallelism: the model split over this many ranks, each a process with its own device
    # (CUDA: cuda:0 .. N-1) and its share of the heads, MLP rows, vocabulary and KV cache; rank 0
    # schedules and serves (services/engine/parallel/). Pipeline parallelism is not implemented: its
    # flag exists to refuse N > 1 by name.
    tensor_parallel_size: int = flag(
        1,
        "ranks one engine's model is split over (torch.distributed; on CUDA one GPU each); --engines for replicas",
        aliases=("--tp-size", "-tp"),
    )
    distributed_backend: str = flag(
        "auto",
        "torch.distributed backend of the ranks: auto (NCCL on CUDA, gloo on CPU), gloo or nccl",
        choices=DISTRIBUTED_BACKENDS,
    )
    pipeline_parallel_size: int = flag(
        1,
        "pipeline stages of one engine; only 1",
        aliases=("--pp-size", "-pp"),
        parse=only((1,), int, NOT_PIPELINE_PARALLEL),
    )
    # Accepted for vLLM's command lines: models are Turnout's own code, nothing from the model's
    # repository is ever imported or run.
    trust_remote_code: bool = flag(
        False, "accepted and ignored: Turnout never runs code from a model's repository (its models are built in)"
    )
    # Port of the Prometheus /metrics HTTP endpoint (None: not served).
    metrics_port: int | None = None
    # Who may call this service, and TLS (turnout/security.py; the CLI refuses to start without a token).
    security: ServiceSecurity = field(default_factory=ServiceSecurity)
    # CUDA graphs for decode-only batches (CUDA and a graph-safe attention backend only), captured for
    # batch sizes up to cuda_graph_max_bs (None: see cuda_graph_batch_limit).
    disable_cuda_graph: bool = flag(
        False, "run decode steps eagerly instead of replaying CUDA graphs", aliases=("--enforce-eager",)
    )
    cuda_graph_max_bs: int | None = flag(
        None, "largest decode batch replayed from a CUDA graph (default: --max-running-requests, at most 256)"
    )
    # Longest sequence a replayed decode step may hold: the graphs' block tables are this wide, and
    # the split-K decode grid grows with them (a batch holding a longer sequence runs eagerly).
    cuda_graph_max_seq_len: int = flag(
        8192, "longest sequence a replayed decode step may hold; batches with longer ones run eagerly"
    )
    # LoRA adapters (vLLM's flags; services/engine/lora/, docs/lora.md): served at all, those loaded
    # at start (name, PEFT folder), how many may be on the device at once (the most a step can mix),
    # and the highest rank accepted (every slot is sized for it).
    enable_lora: bool = flag(False, "serve LoRA adapters of the model")
    lora_modules: tuple[tuple[str, Path], ...] = flag(
        (),
        "adapters (PEFT folders) loaded at start, served as `model` NAME and SGLang `lora_path` NAME",
        aliases=("--lora-paths",),  # SGLang's (there a bare path is accepted too; here NAME=PATH)
        metavar="NAME=PATH",
        item=lambda text: _lora_module_word(text),
        show_item=lambda module: f"{module[0]}={module[1]}",
    )
    max_loras: int = flag(
        1, "adapters on the device at once: the most one step can mix", aliases=("--max-loras-per-batch",)
    )
    max_lora_rank: int = flag(16, "highest adapter rank accepted")
    # Benchmarking the service path only (services/engine/skip_forward.py): no forward pass, no sampler;
    # each next token is the previous one + 1, so the engine costs almost nothing per token.
    skip_forward: bool = flag(
        False,
        "benchmarking the service path only: skip the model's forward pass and sampling, each next token "
        "is the previous id + 1 (meaningless text, no logprobs); never for serving",
    )

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
        if self.sampling_defaults not in SAMPLING_DEFAULTS and not self.generation_config_file.is_file():
            raise ValueError(
                f"--sampling-defaults must be one of {', '.join(SAMPLING_DEFAULTS)} or a folder holding a "
                f"generation_config.json, got {self.sampling_defaults!r}"
            )
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"--logprobs-mode must be one of {', '.join(LOGPROBS_MODES)}")
        for key, value in self.override_generation_config.items():
            if key not in GENERATION_CONFIG_KEYS:
                raise ValueError(
                    f"--override-generation-config: {key!r} is not one of {', '.join(GENERATION_CONFIG_KEYS)}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"--override-generation-config: {key} must be a number, got {value!r}")
        if self.pipeline_parallel_size != 1:
            raise ValueError(f"--pipeline-parallel-size {self.pipeline_parallel_size}: {NOT_PIPELINE_PARALLEL}")
        if self.kv_cache_dtype != "auto":
            raise ValueError(f"--kv-cache-dtype {self.kv_cache_dtype}: {KV_CACHE_DTYPE_ONLY_AUTO}")
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
        for name, value in positive.items():
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
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
        if self.skip_forward and self.tensor_parallel_size > 1:
            raise ValueError("--skip-forward runs one rank: it cannot be combined with --tensor-parallel-size > 1")
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
    def generation_config_file(self) -> Path:
        """The generation_config.json the sampling defaults come from (unless they are `openai`)."""
        folder = self.model if self.sampling_defaults in SAMPLING_DEFAULTS else Path(self.sampling_defaults)
        return folder / "generation_config.json"

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


def _lora_module_word(text: str) -> tuple[str, Path]:
    try:
        return parse_lora_module(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def request_limit_fields() -> tuple[Field[Any], ...]:
    """The EngineConfig fields that bound one request's work (declared with `_limit`)."""
    return tuple(f for f in fields(EngineConfig) if "limit" in f.metadata)


def limit_flag(limit: Field[Any]) -> str:
    return "--" + limit.name.replace("_", "-")
