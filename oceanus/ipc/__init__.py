"""Moving messages and tensors between two processes of one machine, for any part of Oceanus.

- `rings.py`    single-producer rings in shared memory (/dev/shm) that carry tensor bytes, with
                one-off files for what does not fit
- `tensors.py`  the tensors of one message packed into one ring block, and viewed back
- `channel.py`  length-framed `marshal` messages over a stream socket (their tensors placed in a
                ring: `send_tensors`), typed by `MessageKinds`; a `Mailbox` through which
                several threads read one channel

These modules import nothing of Oceanus but the core's datatype table and its BYTES codec
(`oceanus.core.datatypes`, `oceanus.core.tensor_bytes`; an import-linter contract in
pyproject.toml), so a backend's worker, a frontend process and the core can all use them.
This `__init__` stays import-free: worker processes must start fast.
"""
