"""Frontend worker processes (`--frontend-workers N`): HTTP and gRPC served beside the core.

Both ends live here: the core process's side (`supervisor` starts and restarts the workers,
`core_link` answers each one's channel, `mirror` builds the model configs they validate against)
and the worker's side (`client` calls the core, `handlers` answers the hot path itself), with
`messages`, what crosses between them. The worker process's entry point is
oceanus/frontend_worker.py.
"""
