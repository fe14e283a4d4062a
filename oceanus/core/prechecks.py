"""What a frontend may check of a request on the core's behalf, before the core sees it.

Frontend worker processes (frontends/workers/mirror.py) validate a request against a mirror of
its version's config, and hash it for the response cache, so that cost is paid in the worker.
They must run the core's very functions, not copies: the core skips its own check, and uses the
key, only when the request carries the `serial` of the version it resolves
(`InferRequest.checked`), which is sound only if the worker ran exactly what the core would.
So these four are part of the core's face; the rest of `validation` (batch checks, input
ordering) and of `response_cache` (the cache, its settings) stays behind it.
"""

from oceanus.core.response_cache import cacheable, request_key
from oceanus.core.validation import TensorSpec, validate_request

__all__ = ["TensorSpec", "cacheable", "request_key", "validate_request"]
