"""`oceanus tune`'s pieces in process: the search space, the frontier, perf_analyzer's CSV, the
request the built-in generator sends, and the SVG/HTML it writes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.repository.model_config import parse_config_text
from oceanus.tune import frontier, plots
from oceanus.tune.loadgen import build_request
from oceanus.tune.measure import Measurement
from oceanus.tune.output import config_text, recommended_config
from oceanus.tune.perf_analyzer import parse_csv, shape_flags
from oceanus.tune.report import RunInfo, render
from oceanus.tune.space import Candidate, Space, apply, from_config
from oceanus.tune.sweep import Outcome, Trial

SIMPLE = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def config(text: str = SIMPLE) -> mc.ModelConfig:
    return parse_config_text(text, "test")


def point(
    config_id: int, concurrency: int, throughput: float, p99_ms: float, **fields: Any
) -> Measurement:
    values: dict[str, Any] = {
        "config_id": config_id,
        "phase": "sweep",
        "concurrency": concurrency,
        "throughput": throughput,
        "p50_ms": p99_ms / 2,
        "p90_ms": p99_ms * 0.8,
        "p99_ms": p99_ms,
        "avg_ms": p99_ms / 2,
        "errors": 0,
        "seconds": 1.0,
        "avg_batch": 1.0,
        "queue_us": 5.0,
        "compute_us": 30.0,
        "generator": "built-in",
    }
    values.update(fields)
    return Measurement(**values)


# ---- the space --------------------------------------------------------------------------------


def test_space_bounds_follow_the_model_and_the_cpus() -> None:
    space = Space(config(), latency_budget_ms=1.0, cpus=2)
    assert space.instance_counts == [1, 2]
    assert space.can_batch
    assert space.delays_us == [100]  # 500 and 2000 µs exceed a quarter of 1 ms
    first = space.first_stage()
    assert [(c.instances, c.dynamic_batching) for c in first] == [
        (1, False),
        (1, True),
        (2, False),
        (2, True),
    ]
    assert Space(config(), 100.0, cpus=16).instance_counts == [1, 2, 4, 8]
    unbatched = config(SIMPLE.replace("max_batch_size: 8", "max_batch_size: 0"))
    assert not Space(unbatched, 100.0, cpus=2).can_batch
    assert all(not c.dynamic_batching for c in Space(unbatched, 100.0, cpus=2).first_stage())


def test_neighbors_change_one_setting_each() -> None:
    space = Space(config(), latency_budget_ms=100.0, cpus=2)
    plain = space.neighbors(Candidate(1, 8, False))
    assert plain == [
        ("dynamic batching", Candidate(1, 8, True)),
        ("instances", Candidate(2, 8, False)),
    ]
    batching = dict(
        ((stage, c.max_batch_size, c.delay_us, c.preferred, c.instances), c)
        for stage, c in space.neighbors(Candidate(2, 8, True))
    )
    assert set(batching) == {
        ("max batch size", 16, 0, (), 2),
        ("queue delay", 8, 100, (), 2),
        ("queue delay", 8, 500, (), 2),
        ("queue delay", 8, 2000, (), 2),
        ("max batch size", 4, 0, (), 2),
        ("instances", 8, 0, (), 1),
    }
    delayed = [c for stage, c in space.neighbors(Candidate(2, 8, True, delay_us=500))]
    assert Candidate(2, 8, True, preferred=(4, 8), delay_us=500) in delayed
    assert Candidate(2, 8, True, delay_us=0) in delayed
    # no neighbour is ever the shipped config itself, and none leaves the bounds
    shipped = space.shipped
    assert all(not c.shipped for _, c in space.neighbors(shipped))
    assert all(c.max_batch_size <= 256 for _, c in space.neighbors(Candidate(1, 256, True)))


def test_keys_treat_the_default_preferred_size_as_the_max() -> None:
    assert Candidate(2, 8, True).key == Candidate(2, 8, True, preferred=(8,)).key
    assert Candidate(1, 8, False, delay_us=500).key == Candidate(1, 8, False).key
    shipped = from_config(config())
    assert shipped.shipped and shipped.key == Candidate(1, 8, False).key


def test_apply_changes_only_the_tuned_settings() -> None:
    base = config()
    tuned = apply(base, Candidate(2, 16, True, preferred=(8, 16), delay_us=500))
    assert tuned.max_batch_size == 16
    groups = [(g.count, g.kind) for g in tuned.instance_group]
    assert groups == [(2, mc.ModelInstanceGroup.KIND_CPU)]
    assert list(tuned.dynamic_batching.preferred_batch_size) == [8, 16]
    assert tuned.dynamic_batching.max_queue_delay_microseconds == 500
    assert tuned.parameters["intra_op_thread_count"].string_value == "1"
    assert tuned.input == base.input and base.max_batch_size == 8  # the base is untouched
    off = apply(tuned, Candidate(1, 8, False))
    assert not off.HasField("dynamic_batching")
    # the text it writes parses back to the same config
    assert parse_config_text(config_text(tuned), "again") == tuned


# ---- the frontier -----------------------------------------------------------------------------


def test_frontier_and_choice_within_the_budget() -> None:
    points = [
        point(1, 1, 1000, 1.0),
        point(1, 2, 1800, 2.0),
        point(1, 4, 1700, 4.0),  # dominated by (1800, 2.0)
        point(2, 4, 3000, 3.0),
        point(2, 8, 3500, 12.0),
        point(2, 16, 2000, 1.5, error="failed"),  # failed: never on the frontier
    ]
    assert [(p.config_id, p.concurrency) for p in frontier.frontier(points)] == [
        (1, 1),
        (1, 2),
        (2, 4),
        (2, 8),
    ]
    chosen = frontier.best_within(points, budget_ms=10.0)
    assert chosen is not None and (chosen.config_id, chosen.concurrency) == (2, 4)
    assert frontier.score(points[:3], 10.0) == 1800
    assert frontier.score(points, 0.5) is None


def test_median_score_over_side_by_side_rounds() -> None:
    rounds = [point(1, 8, 100, 5.0), point(1, 8, 300, 5.0), point(1, 8, 200, 50.0)]
    assert frontier.median_score(rounds, budget_ms=10.0) == 200
    assert frontier.median_score([*rounds, point(1, 8, 1, 60)], budget_ms=10.0) is None


# ---- perf_analyzer and the built-in generator ------------------------------------------------


def test_perf_analyzer_csv() -> None:
    text = (
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
        "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
        "p50 latency,p90 latency,p95 latency,p99 latency\n"
        "4,4591.86,42,794,2,1,24,0,0,806,1216,1378,2038\n"
    )
    result = parse_csv(text)
    assert result.throughput == 4591.86
    assert (result.p50_us, result.p90_us, result.p99_us) == (806, 1216, 2038)
    assert result.avg_us == 42 + 794 + 2 + 1 + 24
    with pytest.raises(ValueError):
        parse_csv("Concurrency,Inferences/Second\n")


def test_shape_flags_name_variable_dimensions() -> None:
    metadata = {"inputs": [{"name": "A", "shape": [-1, 16]}, {"name": "B", "shape": [-1, -1, 3]}]}
    assert shape_flags(metadata, max_batch_size=8) == ["--shape=B:1,3"]
    assert shape_flags(metadata, max_batch_size=0) == ["--shape=A:1,16", "--shape=B:1,1,3"]


def test_built_in_request_is_one_row_of_binary_tensors() -> None:
    metadata = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "TEXT", "datatype": "BYTES", "shape": [-1, 2]},
        ],
        "outputs": [{"name": "OUTPUT0"}],
    }
    request = build_request("simple", metadata, 8, "127.0.0.1")
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v2/models/simple/infer HTTP/1.1"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert int(headers["Content-Length"]) == len(body)
    size = int(headers["Inference-Header-Content-Length"])
    import json

    header = json.loads(body[:size])
    assert [i["shape"] for i in header["inputs"]] == [[1, 16], [1, 2]]
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 16 * 4
    assert header["outputs"] == [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    blob = body[size:]
    assert len(np.frombuffer(blob[:64], dtype=np.int32)) == 16
    assert blob[64:] == (b"\x07\x00\x00\x00oceanus") * 2


# ---- report -----------------------------------------------------------------------------------


def outcome() -> Outcome:
    shipped = Trial(1, from_config(config()), "shipped")
    shipped.points = [point(1, 1, 1000, 1), point(1, 2, 1500, 3)]
    better = Trial(2, Candidate(2, 8, True), "instances and batching")
    better.points = [point(2, 2, 1800, 2), point(2, 4, 2600, 4), point(2, 8, 2700, 40)]
    shipped.side_points = [point(1, 2, 1400, 3, phase="side-by-side")]
    better.side_points = [point(2, 4, 2500, 4, phase="side-by-side")]
    return Outcome(
        [shipped, better], shipped, better, [shipped, better], {1: 1400.0, 2: 2500.0}, rounds=1
    )


def test_svg_charts_are_well_formed() -> None:
    result = outcome()
    series = [plots.Series("a", "#000", t.points) for t in result.trials]
    for svg in (
        plots.throughput_vs_p99(series[1:], result.trials[0].points, None, 10.0),
        plots.throughput_vs_concurrency(series),
        plots.bars([("shipped", 1400.0, "#777"), ("best", None, "#2ca02c")], "infer/s"),
    ):
        root = ET.fromstring(svg)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert plots.log_ticks(0.3, 120) == [0.5, 1, 2, 5, 10, 20, 50, 100]


def test_report_is_self_contained(tmp_path: Path) -> None:
    result = outcome()
    info = RunInfo("simple", 10.0, 3.0, 170.0, 2, "built-in", "today", "started here", 1.0)
    text = recommended_config(result, config(), SIMPLE)
    assert text is not None and "count: 2" in text and "dynamic_batching" in text
    html = render(result, info, text, config_text(config()))
    assert "Recommended: #2 2 instances, max batch 8, dynamic batching (+79%)" in html
    assert html.count("<svg") == 3
    without_namespace = html.replace("http://www.w3.org/2000/svg", "")
    assert "http://" not in without_namespace and "https://" not in without_namespace
    assert "<script" not in html and "<link" not in html
    assert "+  count: 2" in html  # the diff against the shipped config
    assert "Other work competed" not in html
    busy = RunInfo("simple", 10.0, 3.0, 170.0, 2, "built-in", "today", "here", 1.0, load=(1.0, 6.5))
    html = render(result, busy, text, config_text(config()))
    assert "load average 1.0 at the start, 6.5 at the end" in html
    assert "Other work competed for the CPUs" in html
    # the shipped config stays: its own text, unchanged
    result.recommended = result.shipped
    assert recommended_config(result, config(), SIMPLE) == SIMPLE
