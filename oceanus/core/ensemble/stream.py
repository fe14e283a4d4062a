"""A decoupled ensemble's responses: the ensemble whose last step is a decoupled model.

Triton lets an ensemble contain decoupled models and then serves the ensemble as decoupled
(its config says `model_transaction_policy { decoupled: true }`; HTTP infer and ModelInfer
refuse it, gRPC streams and `generate_stream` serve it). Oceanus supports the shape users
build: one decoupled step whose outputs are the ensemble's outputs (core/ensemble/steps.py
`check_decoupled_steps`). The other steps run once, as for any ensemble; then the decoupled
step's request is streamed and each of its responses, its outputs renamed to the ensemble's
tensors, is one ensemble response; its final flag ends the ensemble's stream. See
docs/ensembles.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.model import failure_reason
from oceanus.core.types import InferRequest, InferResponse

if TYPE_CHECKING:
    from oceanus.core.ensemble.steps import EnsembleVersion

FINAL = "triton_final_response"


def check_decoupled_steps(config: mc.ModelConfig, models: dict[str, mc.ModelConfig]) -> None:
    """Decoupled composing models: at most one, last (no step reads its outputs), and writing
    every ensemble output, so that each of its responses is one ensemble response. The
    ensemble is then decoupled itself, as Triton shows it in the config."""
    name = config.name
    steps = config.ensemble_scheduling.step
    decoupled = [s for s in steps if models[s.model_name].model_transaction_policy.decoupled]
    if not decoupled:
        return
    if len(decoupled) > 1:
        raise invalid_arg(
            f"in ensemble {name}, models {', '.join(s.model_name for s in decoupled)} are "
            "decoupled: Oceanus ensembles stream the responses of one decoupled step"
        )
    step = decoupled[0]
    read = {tensor for other in steps for tensor in other.input_map.values()}
    written = set(step.output_map.values())
    outputs = {t.name for t in config.output}
    if written & read or not outputs <= written:
        raise invalid_arg(
            f"in ensemble {name}, model {step.model_name} is decoupled: its outputs must be the "
            "ensemble's outputs, read by no other step (Oceanus streams its responses as the "
            "ensemble's)"
        )
    config.model_transaction_policy.decoupled = True


async def stream_ensemble(
    ensemble: EnsembleVersion,
    request: InferRequest,
    given: dict[str, tuple[str, np.ndarray]],
    rows: int,
    empty_final: bool,
    mark_final: bool,
) -> AsyncIterator[InferResponse]:
    """The ensemble's responses, one per response of its decoupled step."""
    ensemble._inflight += 1
    failure: str | None = "CANCELED"
    try:
        step = ensemble.streamed_step()
        tensors = await ensemble.run_steps(request, given, skip=step)
        if step is None:  # declared decoupled, with no decoupled step: one response
            outputs = {n: a for n, (_, a) in tensors.items() if n in ensemble.outputs}
            response = ensemble._response(request, outputs)
            if mark_final:
                response.parameters[FINAL] = True
            failure = None
            yield response
            return
        step_request = ensemble.step_request(request, step, tensors)
        # The step's final flag always comes (alone, as an empty response, if need be).
        responses = ensemble._composer.infer_stream(step_request, True, True)
        async for answer in responses:
            final = bool(answer.parameters.get(FINAL))
            outputs = {
                step.output_map[t.name]: t.data
                for t in answer.outputs
                if t.name in step.output_map and step.output_map[t.name] in ensemble.outputs
            }
            if outputs or not final:
                response = ensemble._response(request, outputs)
            elif empty_final:
                response = InferResponse(ensemble.name, ensemble.version_str, request.id, [])
            else:
                failure = None
                return
            if mark_final:
                response.parameters[FINAL] = final
            if final:
                failure = None
            yield response
            if final:
                return
        failure = None
    except asyncio.CancelledError:
        raise
    except InferenceServerError as exc:
        failure = failure_reason(exc)
        raise
    finally:
        ensemble._inflight -= 1
        ensemble._finish(request, failure, rows)
