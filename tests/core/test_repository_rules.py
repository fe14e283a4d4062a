"""Repository parsing, version policies, normalization and the index (core/repository/loader.py,
core/repository/model_config.py, core/server.py), in process over fake-backend models: which
versions a
policy serves, which folders count as versions, what a broken config says, and what the index
reports for every model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.errors import ErrorCode, InferenceServerError
from oceanus.core.repository import loader as repository
from oceanus.core.server import ServerCore
from tests.core.fakes import IO_FP32, World, rows


def versions_served(world: World, policy: str, folders: tuple[int, ...] = (1, 2, 3)) -> list[int]:
    world.add("m", IO_FP32 + policy, max_batch_size=8, versions=folders)

    async def scenario(core: ServerCore) -> list[int]:
        return sorted(number for number, v in core.models["m"].versions.items() if v.ready)

    return world.run(scenario)


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("", [3]),  # Triton's default: the latest version
        ("version_policy: { latest { num_versions: 2 } }", [2, 3]),
        ("version_policy: { latest { num_versions: 9 } }", [1, 2, 3]),
        ("version_policy: { all { } }", [1, 2, 3]),
        ("version_policy: { specific { versions: [ 1, 3, 7 ] } }", [1, 3]),
    ],
)
def test_version_policies_choose_the_versions_served(
    world: World, policy: str, served: list[int]
) -> None:
    assert versions_served(world, policy) == served


def test_only_numeric_folders_are_versions(world: World) -> None:
    folder = world.add("m", IO_FP32, max_batch_size=8, versions=(2,))
    for name in ("10a", "01", "v3", ".9", "00"):
        (folder / name).mkdir()
    (folder / "5").write_text("a file, not a folder")
    assert repository.version_folders(folder) == {2: folder / "2"}
    assert versions_served(world, "version_policy: { all { } }", folders=(2,)) == [2]


def test_requests_name_a_version_or_get_the_highest_ready(world: World) -> None:
    world.add(
        "m", IO_FP32 + "version_policy: { specific { versions: [ 1, 2 ] } }", versions=(1, 2, 3)
    )

    async def scenario(core: ServerCore) -> None:
        for named, answered in (("", "2"), ("1", "1"), ("2", "2")):
            request = world.request("m", {"IN": np.ones(4, np.float32)}, model_version=named)
            assert (await core.infer(request, "test")).model_version == answered
        for named, message in (
            ("3", "Request for unknown model: 'm' version 3 is not found"),
            ("x", "Request for unknown model: 'm' version x is not found"),
            ("\u0661", "Request for unknown model: 'm' version \u0661 is not found"),
        ):
            with pytest.raises(InferenceServerError) as caught:
                core.infer(world.request("m", {}, model_version=named), "test")
            assert (caught.value.code, caught.value.message) == (ErrorCode.NOT_FOUND, message)
        with pytest.raises(InferenceServerError, match="'nope' is not found"):
            core.infer(world.request("nope", {}), "test")
        metadata = core.model_metadata("m")
        assert (metadata["versions"], metadata["platform"]) == (["1", "2"], "fake")

    world.run(scenario)


def test_the_index_reports_every_folder_and_why_one_failed(world: World) -> None:
    world.add("good", IO_FP32, max_batch_size=8, versions=(1, 2))
    world.add("bad_backend", IO_FP32, backend="nope")
    world.add("no_versions", IO_FP32 + "version_policy: { specific { versions: [ 4 ] } }")
    world.add("crashes", IO_FP32)
    world.model("crashes").load_error = RuntimeError("boom")
    world.add("typo", "max_batch_sise: 4\n")
    (world.repository / "wrong_name").mkdir()
    (world.repository / "wrong_name" / "config.pbtxt").write_text('name: "other"\n')
    (world.repository / ".hidden").mkdir()

    async def scenario(core: ServerCore) -> None:
        index = {(e["name"], e.get("version")): e for e in core.repository_index()}
        assert index[("good", "2")] == {"name": "good", "version": "2", "state": "READY"}
        assert ("good", "1") not in index
        assert index[("bad_backend", None)]["reason"] == (
            "unable to find backend 'nope' (known backends: fake, fake_cheap, fake_requests)"
        )
        assert index[("no_versions", None)]["reason"] == (
            "at least one version must be available under the version policy of model 'no_versions'"
        )
        assert index[("crashes", "1")] == {
            "name": "crashes",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "failed to load 'crashes' version 1: boom",
        }
        path = world.repository / "typo" / "config.pbtxt"
        assert index[("typo", None)]["reason"] == (
            f'failed to parse {path}: 4:1 : Message type "inference.ModelConfig" has no field '
            'named "max_batch_sise". (did you mean "max_batch_size"?)'
        )
        assert index[("wrong_name", None)]["reason"] == (
            "unexpected directory name 'wrong_name' for model 'other', directory name must "
            "equal model name"
        )
        assert not any(name == ".hidden" for name, _ in index)
        assert [e["name"] for e in core.repository_index(ready_only=True)] == ["good"]
        assert not core.ready()  # strict readiness: a model failed
        assert sorted(core.load_failures())[0][0] == "bad_backend"

    world.run(scenario)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("max_batch_size: -1\n" + IO_FP32, "'max_batch_size' must be non-negative value for m"),
        (
            'input [ { name: "IN" data_type: TYPE_FP32 } ]',
            "model 'm' must specify 'dims' for input 'IN'",
        ),
        (
            'input [ { name: "IN" dims: [ 1 ] } ]',
            "model 'm' must specify 'data_type' for input 'IN'",
        ),
        (
            'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 0 ] } ]',
            "dimension for input 'IN' of model 'm' must be -1 or a positive integer, got 0",
        ),
        (
            "max_batch_size: 4\n" + IO_FP32 + "dynamic_batching { preferred_batch_size: [ 8 ] }",
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            IO_FP32 + 'sequence_batching { control_input [ { name: "S" control [ '
            "{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0 ] } ] } ] }",
            "sequence batching control 'int32_false_true' must have exactly 2 entries for "
            "CONTROL_SEQUENCE_START for m",
        ),
    ],
)
def test_invalid_configs_are_refused_with_tritons_texts(
    world: World, body: str, message: str
) -> None:
    (world.repository / "m" / "1").mkdir(parents=True)
    (world.repository / "m" / "1" / "model.fake").write_text("fake")
    (world.repository / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "fake"\n' + body)

    async def scenario(core: ServerCore) -> str:
        return str(core.repository_index()[0]["reason"])

    assert world.run(scenario) == message


def test_normalization_fills_tritons_defaults(world: World) -> None:
    world.add(
        "m",
        IO_FP32 + "dynamic_batching { priority_levels: 3 }\n"
        'instance_group [ { count: 0 kind: KIND_AUTO }, { name: "named" kind: KIND_CPU } ]',
        max_batch_size=8,
    )
    world.add("seq", IO_FP32 + "sequence_batching { }", max_batch_size=4)

    async def scenario(core: ServerCore) -> None:
        config = core.model_config("m")
        assert list(config.dynamic_batching.preferred_batch_size) == [8]
        assert config.dynamic_batching.default_priority_level == 3
        assert [(g.name, g.count, g.kind) for g in config.instance_group] == [
            ("m_0", 1, mc.ModelInstanceGroup.KIND_CPU),
            ("named", 1, mc.ModelInstanceGroup.KIND_CPU),
        ]
        assert config.version_policy.latest.num_versions == 1
        assert config.optimization.input_pinned_memory.enable
        sequence = core.model_config("seq").sequence_batching
        assert sequence.max_sequence_idle_microseconds == 1_000_000
        assert [g.name for g in core.model_config("seq").instance_group] == ["seq"]

    world.run(scenario)


def test_auto_complete_recognizes_a_model_by_its_file(world: World) -> None:
    """A folder with a registered backend's model file and no config loads with that backend;
    with auto-complete off, the config is required."""
    (world.repository / "bare" / "1").mkdir(parents=True)
    (world.repository / "bare" / "1" / "model.fake").write_text("fake")

    async def loaded(core: ServerCore) -> str:
        return core.model_config("bare").backend

    assert world.run(loaded) == "fake"

    async def refused(core: ServerCore) -> str:
        return str(core.repository_index()[0]["reason"])

    assert world.run(refused, autocomplete=False) == (
        "failed to load model 'bare': config.pbtxt is required when auto-complete is disabled "
        "(--disable-auto-complete-config)"
    )


def test_a_model_in_two_repositories_is_refused(tmp_path: Path) -> None:
    for repo in ("one", "two"):
        (tmp_path / repo / "m").mkdir(parents=True)
    with pytest.raises(InferenceServerError) as caught:
        repository.scan([tmp_path / "one", tmp_path / "two"])
    assert caught.value.message == (
        f"model 'm' appears in multiple repositories: {tmp_path / 'one'} and {tmp_path / 'two'}"
    )


def test_requests_reach_only_ready_versions(world: World) -> None:
    world.add("m", IO_FP32, max_batch_size=8)

    async def scenario(core: ServerCore) -> None:
        version = core.resolve("m")
        await core.manager.unload("m")
        assert not version.ready
        with pytest.raises(InferenceServerError) as caught:
            core.infer(world.request("m", rows()), "test")
        assert caught.value.message == "Request for unknown model: 'm' has no available versions"
        with pytest.raises(InferenceServerError, match="version 1 is not at ready state"):
            core.infer(world.request("m", rows(), model_version="1"), "test")

    world.run(scenario)
