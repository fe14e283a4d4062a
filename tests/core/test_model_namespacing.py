"""--model-namespacing (core/repository/loader.py): the same model name in two repositories loads
twice, the index lists both, a request naming it is refused with Triton's text, and each
repository's ensemble uses its own repository's model (as Triton 2.51 does:
docs/triton-reference-behaviour.md). Without the flag the duplicate name fails the start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from oceanus.backends import builtin
from oceanus.core.errors import InferenceServerError
from oceanus.core.server import CoreOptions, ServerCore
from oceanus.core.types import InferRequest, Tensor

CONSTANT = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 0 + {value})]))
        return out
"""
IO = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
ENSEMBLE = """
name: "{name}"
platform: "ensemble"
{io}
ensemble_scheduling {{ step [ {{ model_name: "m" model_version: -1
  input_map {{ key: "IN" value: "IN" }} output_map {{ key: "OUT" value: "OUT" }} }} ] }}
"""


@pytest.fixture(scope="module")
def repositories(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    roots = []
    for repo, value in (("a", 1), ("b", 2)):
        root = tmp_path_factory.mktemp(repo)
        (root / "m" / "1").mkdir(parents=True)
        (root / "m" / "config.pbtxt").write_text(f'name: "m"\nbackend: "python"\n{IO}')
        (root / "m" / "1" / "model.py").write_text(CONSTANT.replace("{value}", str(value)))
        (root / f"ens_{repo}" / "1").mkdir(parents=True)
        (root / f"ens_{repo}" / "config.pbtxt").write_text(
            ENSEMBLE.format(name=f"ens_{repo}", io=IO)
        )
        roots.append(root)
    return roots


def request(model: str) -> InferRequest:
    return InferRequest(model, inputs=[Tensor("IN", "INT32", (1,), np.array([5], np.int32))])


def test_same_name_in_two_repositories(repositories: list[Path]) -> None:
    async def main() -> None:
        options = CoreOptions(
            repositories=repositories, backends=builtin.registry(), model_namespacing=True
        )
        core = ServerCore(options)
        await core.start()
        try:
            assert core.load_failures() == []
            index = core.repository_index()
            assert sorted(e["name"] for e in index) == ["ens_a", "ens_b", "m", "m"]
            with pytest.raises(InferenceServerError) as error:
                core.infer(request("m"), "test")
            assert error.value.message == (
                "There are 2 identifiers of model 'm' in global map, model namespace must be "
                "provided to resolve ambiguity."
            )
            a = await core.infer(request("ens_a"), "test")
            b = await core.infer(request("ens_b"), "test")
            assert (a.model_name, a.outputs[0].data.tolist()) == ("ens_a", [1])
            assert (b.model_name, b.outputs[0].data.tolist()) == ("ens_b", [2])
            assert sorted(s["name"] for s in core.statistics()) == ["ens_a", "ens_b", "m", "m"]
        finally:
            await core.shutdown()

    asyncio.run(main())


def test_without_namespacing_a_duplicate_name_is_an_error(repositories: list[Path]) -> None:
    async def main() -> None:
        core = ServerCore(CoreOptions(repositories=repositories, backends=builtin.registry()))
        with pytest.raises(InferenceServerError, match="appears in multiple repositories"):
            await core.start()
        await core.shutdown()

    asyncio.run(main())


def test_the_flag_parses() -> None:
    from oceanus.cli import parse_args

    assert parse_args(["--model-namespacing=true"])[0].model_namespacing
    assert not parse_args([])[0].model_namespacing
