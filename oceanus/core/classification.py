"""Triton's classification extension: an output requested with the `classification` parameter
(k) is answered as BYTES, its top k entries as `"value:index"` or `"value:index:label"`.

Recorded against Triton 2.51 (docs/triton-reference-behaviour.md, section 17): a batched output
gives k per row (shape [batch, k]), a non-batched one k over all its elements (shape [k]); k is
capped at the element count; ties keep the lower index first; floats print as C's `%f`, integers
as they are; the labels are the lines of the output's `label_filename` (in the model's folder;
an index past the last line has none). Triton does it in its frontends, after the model (or the
ensemble) answered, so the labels are those of the model the client called."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from oceanus.core.errors import invalid_arg
from oceanus.core.types import InferRequest, InferResponse, Tensor

log = logging.getLogger("oceanus.core")

# Types Triton ranks (its classification.cc); others are refused after the model ran.
_RANKED = frozenset(
    ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64")
)
_FLOATS = frozenset(("FP32", "FP64"))


def class_counts(request: InferRequest) -> dict[str, int] | None:
    """The outputs the request wants classified, with their k; None: none (the common case)."""
    if request.outputs is None:
        return None
    counts = {
        o.name: int(o.parameters["classification"])
        for o in request.outputs
        if o.parameters.get("classification")
    }
    return counts or None


def top_k(array: np.ndarray, datatype: str, k: int, batched: bool, labels: list[str]) -> np.ndarray:
    """The classification strings of one output (BYTES elements, as an object array)."""
    if datatype not in _RANKED:
        # Triton 2.51 refuses FP16 so; a BYTES output crashes it, we refuse it the same way
        raise invalid_arg(
            f"class result not available for output due to unsupported type '{datatype}'"
        )
    rows = array.reshape(array.shape[0] if batched and array.ndim else 1, -1)
    count = min(k, rows.shape[1])
    floats = datatype in _FLOATS
    out = np.empty((rows.shape[0], count), dtype=object)
    last = rows.shape[1] - 1
    for r, row in enumerate(rows):
        # descending, ties by ascending index: a stable ascending sort of the reversed row
        order = last - np.argsort(row[::-1], kind="stable")[::-1][:count]
        for c, index in enumerate(order):
            value = row[index]
            text = f"{float(value):f}" if floats else str(int(value))
            text += f":{index}"
            if index < len(labels):
                text += f":{labels[index]}"
            out[r, c] = text.encode()
    return out if batched else out.reshape(count)


def read_labels(folder: Path, filenames: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Each output's labels from its label_filename (lines), relative to the model's folder."""
    labels: dict[str, list[str]] = {}
    for output, filename in filenames:
        if not filename:
            continue
        try:
            labels[output] = (folder / filename).read_text().splitlines()
        except OSError as exc:  # Triton fails the load; we serve without the labels, loudly
            log.error("output '%s': cannot read label file '%s': %s", output, filename, exc)
    return labels


def classified(
    response: InferResponse, counts: dict[str, int], batched: bool, labels: dict[str, list[str]]
) -> InferResponse:
    """The response with the requested outputs replaced by their top-k strings."""
    outputs: list[Tensor] = []
    for tensor in response.outputs:
        k = counts.get(tensor.name)
        if k is None:
            outputs.append(tensor)
            continue
        data = top_k(tensor.data, tensor.datatype, k, batched, labels.get(tensor.name, []))
        outputs.append(Tensor(tensor.name, "BYTES", data.shape, data))
    response.outputs = outputs
    return response


def chain(
    future: asyncio.Future[InferResponse],
    counts: dict[str, int],
    batched: bool,
    labels: dict[str, list[str]],
) -> asyncio.Future[InferResponse]:
    """A future of the classified response (an unsupported type fails it, as in Triton)."""
    result: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()

    def done(inner: asyncio.Future[InferResponse]) -> None:
        if result.done():
            return
        if inner.cancelled():
            result.cancel()
            return
        error = inner.exception()
        if error is not None:
            result.set_exception(error)
            return
        try:
            result.set_result(classified(inner.result(), counts, batched, labels))
        except Exception as exc:
            result.set_exception(exc)

    future.add_done_callback(done)

    def cancel(outer: asyncio.Future[Any]) -> None:
        if outer.cancelled():
            future.cancel()

    result.add_done_callback(cancel)
    return result
