"""Model warmup (core/repository/warmup.py, `model_warmup` in config.pbtxt), in process over
fake-backend
models: samples run on every instance before the model is ready, with the data the config asks
for, uncounted; a failing or malformed sample fails the load with Triton's text. A Python model
warmed up with strings and a decoupled one stay on a real server: tests/wire/test_warmup.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from oceanus.core.errors import InferenceServerError, invalid_arg
from oceanus.core.server import ServerCore
from tests.core.fakes import World
from tests.core.warmup_text import warmup_input, warmup_sample

IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
STRINGS = """
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 3 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 3 ] } ]
"""


def _warmup(*samples: str) -> str:
    return f"model_warmup [ {', '.join(samples)} ]\n"


def reasons(world: World) -> dict[str, str]:
    """Each model's load failure ("" for a ready model)."""

    async def scenario(core: ServerCore) -> dict[str, str]:
        return {e["name"]: e.get("reason", "") for e in core.repository_index()}

    return world.run(scenario)


def test_samples_run_on_every_instance_with_their_data_uncounted(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.add(
        "warm",
        IO
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        + _warmup(
            warmup_sample(
                "zeros",
                [warmup_input("INPUT0", "zero_data: true"), warmup_input("INPUT1", "zero_data: 1")],
            ),
            warmup_sample(
                "random",
                [
                    warmup_input("INPUT0", "random_data: true"),
                    warmup_input("INPUT1", "random_data: true"),
                ],
                batch_size=8,
                count=2,
            ),
            warmup_sample("skipped", [warmup_input("INPUT0", "zero_data: 1")], batch_size=0),
        ),
        max_batch_size=8,
    )
    model = world.model("warm")
    caplog.set_level(logging.INFO, logger="oceanus.core.warmup")

    async def scenario(core: ServerCore) -> None:
        # 2 instances x (zeros once + random twice), before the model was ready
        assert sorted(e.instance for e in model.executed) == ["warm_0_0"] * 3 + ["warm_0_1"] * 3
        assert [e.rows for e in model.executed if e.instance == "warm_0_0"] == [1, 8, 8]
        zeros = next(e for e in model.executed if e.rows == 1)
        assert {n: (a.shape, int(a.sum())) for n, a in zeros.inputs.items()} == {
            "INPUT0": ((1, 16), 0),
            "INPUT1": ((1, 16), 0),
        }
        entry = core.statistics("warm")[0]
        assert (entry["inference_count"], entry["execution_count"]) == (0, 0)
        data = {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32)}
        await core.infer(world.request("warm", data), "test")
        entry = core.statistics("warm")[0]
        assert (entry["inference_count"], entry["execution_count"]) == (1, 1)

    world.run(scenario)
    for instance in ("warm_0_0", "warm_0_1"):
        prefix = f"model 'warm' instance {instance} is running warmup sample"
        assert f"{prefix} 'zeros' for iteration 1" in caplog.messages
        assert f"{prefix} 'random' for iteration 2" in caplog.messages
        assert f"{prefix} 'zeros' for iteration 2" not in caplog.messages
    assert "skipping batch 0 warmup sample 'skipped' of 'warm'" in caplog.messages


def test_an_unbatched_model_gets_one_execution_per_request(world: World) -> None:
    world.add(
        "flat",
        IO
        + _warmup(
            warmup_sample(
                "z",
                [warmup_input("INPUT0", "zero_data: 1"), warmup_input("INPUT1", "zero_data: 1")],
                3,
            )
        ),
    )
    reasons(world)
    assert [e.rows for e in world.model("flat").executed] == [1, 1, 1]
    assert world.model("flat").executed[0].inputs["INPUT0"].shape == (16,)


def test_input_data_files(world: World) -> None:
    """Raw bytes from <model>/warmup/<file> (then <version>/warmup/), BYTES in Triton's
    length-prefixed serialization; request-style models get `batch_size` requests, each
    answered on its own."""
    folder = world.add(
        "from_file",
        IO
        + _warmup(
            warmup_sample(
                "file",
                [
                    warmup_input("INPUT0", 'input_data_file: "in0"'),
                    warmup_input("INPUT1", "zero_data: true"),
                ],
                batch_size=2,
            )
        ),
        max_batch_size=8,
    )
    (folder / "1" / "warmup").mkdir()  # found in the version folder when the model's has none
    (folder / "1" / "warmup" / "in0").write_bytes(np.arange(16, dtype=np.int32).tobytes())
    words = b"".join(len(w).to_bytes(4, "little") + w for w in (b"hello", b"warm", b"world"))
    text = warmup_sample(
        "text", [warmup_input("INPUT0", 'input_data_file: "words"', "3", "TYPE_STRING")], 3
    )
    for name, data in (("strings", words), ("wrong_strings", words.replace(b"warm", b"cold"))):
        folder = world.add(name, STRINGS + _warmup(text), backend="fake_requests", max_batch_size=4)
        (folder / "warmup").mkdir()
        (folder / "warmup" / "words").write_bytes(data)

        def check(inputs: dict[str, np.ndarray], _: str) -> dict[str, np.ndarray]:
            found = inputs["INPUT0"].reshape(-1).tolist()
            if found != [b"hello", b"warm", b"world"]:
                raise invalid_arg(f"unexpected warmup data {found}")
            return {"OUTPUT0": inputs["INPUT0"]}

        world.model(name).compute = check
    short = world.add(
        "short_file",
        IO
        + _warmup(
            warmup_sample(
                "s",
                [
                    warmup_input("INPUT0", 'input_data_file: "in0"'),
                    warmup_input("INPUT1", "zero_data: 1"),
                ],
            )
        ),
        max_batch_size=8,
    )
    (short / "warmup").mkdir()
    (short / "warmup" / "in0").write_bytes(b"\0" * 60)

    found = reasons(world)
    assert (found["from_file"], found["strings"]) == ("", "")
    batch = world.model("from_file").executed[0].inputs["INPUT0"]
    assert batch.tolist() == [list(range(16))] * 2
    assert world.model("strings").executed[0].rows == 3  # three requests of one row
    assert found["wrong_strings"] == (
        "failed to run warmup sample 'text': "
        + "unexpected warmup data [b'hello', b'cold', b'world']; " * 3
    )
    assert found["short_file"] == (
        "warmup sample 's': warmup setting expects 64 bytes, but the data provided from in0only "
        "has 60 bytes"
    )


def test_a_failing_sample_fails_the_load(world: World) -> None:
    samples = _warmup(
        warmup_sample(
            "zero sample",
            [warmup_input("INPUT0", "zero_data: 1"), warmup_input("INPUT1", "zero_data: 1")],
        )
    )
    world.add("failing", IO + samples, max_batch_size=8)
    world.model("failing").failing_instances["failing_0"] = invalid_arg("An Error Occurred")
    world.add("crashing", IO + samples, max_batch_size=8)
    world.model("crashing").failing_instances["crashing_0"] = RuntimeError("boom")
    world.add(
        "wrong_dims",
        IO
        + _warmup(
            warmup_sample(
                "dims",
                [
                    warmup_input("INPUT0", "zero_data: 1", "8"),
                    warmup_input("INPUT1", "zero_data: 1"),
                ],
            )
        ),
        max_batch_size=8,
    )

    async def scenario(core: ServerCore) -> None:
        found = {e["name"]: e.get("reason", "") for e in core.repository_index()}
        assert found["failing"] == "failed to run warmup sample 'zero sample': An Error Occurred; "
        assert found["crashing"] == (
            "failed to run warmup sample 'zero sample': RuntimeError: boom; "
        )
        assert found["wrong_dims"].startswith(
            "warmup sample 'dims': [request id: <id_unknown>] unexpected shape for input "
            "'INPUT0' for model 'wrong_dims'. Expected [-1,16], got [1,8]."
        )
        assert not world.model("wrong_dims").executed  # checked before any instance loaded
        with pytest.raises(InferenceServerError) as caught:
            await core.load_model("failing")
        assert caught.value.message == (
            "failed to load 'failing': failed to run warmup sample 'zero sample': An Error "
            "Occurred; "
        )

    world.run(scenario, control_mode="explicit", startup_models=["*"])


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (
            warmup_sample(
                "no data", [warmup_input("INPUT0", ""), warmup_input("INPUT1", "zero_data: true")]
            ),
            "warmup sample 'no data': warmup setting expects input 'INPUT0' to have "
            "input_data_type set",
        ),
        (
            warmup_sample(
                "unknown",
                [warmup_input("INPUT0", "zero_data: 1"), warmup_input("BOGUS", "zero_data: 1")],
            ),
            "warmup sample 'unknown': unexpected inference input 'BOGUS' for model 'bad'",
        ),
        (
            warmup_sample(
                "variable",
                [warmup_input("INPUT0", "zero_data: 1", "-1"), warmup_input("INPUT1", "")],
            ),
            "warmup sample 'variable': warmup setting expects all variable-size dimensions are "
            "specified for input 'INPUT0'",
        ),
        (
            warmup_sample("missing", [warmup_input("INPUT0", "zero_data: 1")]),
            "warmup sample 'missing': [request id: <id_unknown>] expected 2 inputs but got 1 "
            "inputs for model 'bad'. Got input(s) ['INPUT0'], but missing required input(s) "
            "['INPUT1']. Please provide all required input(s).",
        ),
        (
            # Both inputs: Triton counts them before it looks at their types.
            warmup_sample(
                "type",
                [
                    warmup_input("INPUT0", "zero_data: 1", datatype="TYPE_FP32"),
                    warmup_input("INPUT1", "zero_data: 1"),
                ],
            ),
            "warmup sample 'type': [request id: <id_unknown>] inference input 'INPUT0' data-type "
            "is 'FP32', but model 'bad' expects 'INT32'",
        ),
        (
            warmup_sample("both", [warmup_input("INPUT0", "zero_data: true random_data: true")]),
            'Field "random_data" is specified along with field "zero_data", another member of '
            'oneof "input_data_type"',
        ),
        (
            warmup_sample("no file", [warmup_input("INPUT0", 'input_data_file: "nope"')]),
            "warmup sample 'no file': failed to open text file for read",
        ),
    ],
)
def test_bad_warmup_config_fails_the_load(world: World, sample: str, message: str) -> None:
    world.add("bad", IO + _warmup(sample), max_batch_size=8)
    assert message in reasons(world)["bad"]
    assert not world.model("bad").executed and world.model("bad").loads == 0
