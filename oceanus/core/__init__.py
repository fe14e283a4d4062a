"""The server core: models, scheduling, statistics; protocol-agnostic (numpy, never HTTP/gRPC/JSON).

Its face is `FACE` below: the only modules of the core that frontends and backends may import
(besides this package itself). It is an allow-list, so a new core module is private until it is
added here on purpose; the import-linter contract "Frontends and backends use the core's face
only" (pyproject.toml, tools/face_contract.py) reads this tuple and reports every other import.
- `server`: `ServerCore` (infer, health, metadata, statistics, model control) and `CoreOptions`;
- `backend`, `backend_registry`: the contract a backend implements and how it is registered;
- `types`, `datatypes`, `errors`, `tensor_bytes`: requests, tensors, Triton's datatypes and
  error codes, the BYTES codec;
- `model` (a version's state and statistics, read by the metrics frontend), `shared_memory`;
- `response_stream`: how a decoupled backend hands its responses to the event loop;
- `prechecks`: the request checks a frontend worker runs for the core (validation, cache key);
- `generation`: the typed language-model request and response (token ids, `SamplingParams`,
  `GenerationOutput`) the OpenAI routes and the LLM engine share;
- `lora`: the ready models' LoRA adapters, found and loaded/unloaded for the OpenAI routes;
- `observability.tracing`, `.statistics`, `.latency`, `.custom_metrics`: what the frontends
  export and what backends record;
- `repository.model_config`, `repository.load_hints`: config parsing and load-error advice.
Each entry is one module: listing a package would not open its children.

Behind it, one room per feature that spans files: `scheduling/` (queues, batchers, instances,
rate limiter), `repository/` (folders, configs, the model lifecycle, warmup), `ensemble/`,
`observability/`; and single-file features at the top (`validation`, `response_cache`, `clock`).
This __init__ imports nothing, so importing a face module loads only what it needs.
"""

FACE = (
    "server",
    "backend",
    "backend_registry",
    "types",
    "datatypes",
    "errors",
    "tensor_bytes",
    "model",
    "shared_memory",
    "response_stream",
    "prechecks",
    "generation",
    "lora",
    "observability.tracing",
    "observability.statistics",
    "observability.latency",
    "observability.custom_metrics",
    "repository.model_config",
    "repository.load_hints",
)
