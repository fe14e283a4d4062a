"""Triton's Python backend: `model.py` files run in worker processes, one per model instance.

- `backend.py`   the server side: PythonBackend/PythonInstance (starts, watches and restarts the
                 worker, sends batches, receives responses, serves BLS calls)
- `worker.py`    the worker process (`python -m oceanus.backends.python.worker FD`)
- `transport.py` the control channel (framed marshal messages over a socketpair) and the
                 shared-memory rings that carry tensor bytes
- `utils.py`     the `triton_python_backend_utils` API model.py files import

This package's __init__ stays import-free: the worker imports only `transport` and `utils`.
"""
