"""Triton's Python backend: `model.py` files run in stub processes, one per model instance.

Server side:
- `backend.py`      PythonBackend: the model file, auto-complete (in a short-lived stub)
- `instance.py`     PythonInstance: drives one stub (start, watchdog, restart, health,
                    is_ready, execute_requests, execute timeout, close)
- `stub_launcher.py` starting a stub process (rings, socketpair, Init until Ready)
- `exec_env.py`     a model's own environment (EXECUTION_ENV_PATH): unpack once, probe
- `options.py`      --backend-config=python,... (ring sizes, stub timeout)
- `model_args.py`   what a model's initialize(args) receives (both modes)
- `in_process.py`   the opt-in mode without a stub (`oceanus_in_process`), pb_utils' runtime
- `batches.py`      what is in flight: a batch's Exec, where Result / Response go
- `dispatch.py`     which part of the backend each message from a stub goes to
- `server_calls.py` BLS requests and pb_utils calls, through the core's ServerHandle
Both sides:
- `messages.py`     the typed messages between server and stub
- `transport.py`    their channel and rings (oceanus.ipc, bound to these messages)
Stub side:
- `pb_stub.py`      the stub process (`python -m oceanus.backends.python.pb_stub FD`)
- `model_code.py`   import model.py, run its coroutines, check what it returns, format errors
- `utils.py`, `pb/` the `triton_python_backend_utils` API model.py files import

This package's __init__ stays import-free: the stub must not import the server side.
"""
