"""`import triton_python_backend_utils as pb_utils` for model.py files written for Triton.

The implementation is `oceanus.backends.python.utils`; inside a Python-backend worker process
this name refers to that very module. Outside one, importing it works too (unit tests of a
model.py), without the services only a running server provides (BLS, response senders).
"""

from oceanus.backends.python.utils import *  # noqa: F403
from oceanus.backends.python.utils import __all__  # noqa: F401
