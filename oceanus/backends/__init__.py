"""The built-in backends, each behind the core's contract (oceanus/core/backend.py).

`builtin.specs()` declares them to the core's registry without importing any framework; this
package's `__init__` imports nothing, because the Python backend's worker processes import
`oceanus.backends.python` and must start fast.
"""
