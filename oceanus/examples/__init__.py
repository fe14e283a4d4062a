"""Built-in example Triton model repository, generated locally with the ``onnx`` package.

Nothing is downloaded: every model is built with ``onnx.helper`` from seeded random weights.

    from oceanus.examples import example_repository, write_example_repository
    repo = example_repository(["simple", "identity_fp32"])  # cached, generated on first use
    write_example_repository("my_models")  # an editable copy of all models

or ``python -m oceanus.examples DIR [--models a,b,...]``.
"""

from .repository import (
    EXAMPLE_MODELS,
    GENERATOR_VERSION,
    SMALL_MODELS,
    example_repository,
    write_example_repository,
)

__all__ = [
    "EXAMPLE_MODELS",
    "GENERATOR_VERSION",
    "SMALL_MODELS",
    "example_repository",
    "write_example_repository",
]
