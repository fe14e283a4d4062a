"""The model repository: from folders on disk to loaded, ready model versions.

`loader` scans the repository folders, reads and completes each config (`model_config`: Triton's
protobuf text format, normalized as Triton normalizes it), chooses versions and loads one
(blocking, on the core's loader threads); `warmup` runs a version's `model_warmup` samples before
it is READY; `manager` owns the lifecycle (load, reload without downtime, unload, polling, the
control modes); `load_hints` adds advice for the log to a failed load. Frontends see none of it
but through `ServerCore`; backends use `model_config` and `load_hints` only.
"""
