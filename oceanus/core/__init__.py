"""The server core: models, scheduling, statistics; protocol-agnostic (numpy, never HTTP/gRPC/JSON).

Its face, what frontends and backends may import (the import-linter contract "Frontends and
backends use the core's face only" in pyproject.toml holds it):
- `server`: `ServerCore` (infer, health, metadata, statistics, model control) and `CoreOptions`;
- `backend`, `backend_registry`: the contract a backend implements and how it is registered;
- `types`, `datatypes`, `errors`, `tensor_bytes`: requests, tensors, Triton's datatypes and
  error codes, the BYTES codec;
- `model` (a version's state and statistics, read by the metrics frontend), `shared_memory`;
- `observability.tracing`, `.statistics`, `.latency`, `.custom_metrics`: what the frontends
  export and what backends record;
- `repository.model_config`, `repository.load_hints`: config parsing and load-error advice.

Behind it, one room per feature that spans files: `scheduling/` (queues, batchers, instances,
rate limiter), `repository/` (folders, configs, the model lifecycle, warmup), `ensemble/`,
`observability/`; and single-file features at the top (`validation`, `response_cache`, `clock`).
This __init__ imports nothing, so importing a face module loads only what it needs.
"""
