"""bench/run.py's results read back: medians over repeats, the in-process limits, ratios, the
issue's targets, and the tables it prints."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import benchlib

# Models whose throughput target is relative to the in-process limit (in report order).
TARGET_MODELS = (
    "resnet50_onnx",
    "text_classifier_onnx",
    "resnet_small_pytorch",
    "resnet50_pytorch",
    "resnet50_openvino",
)
# Same ONNX file: the in-process limit and the naive server are measured once, for `simple`.
SAME_FILE = {"simple_dyna": "simple"}
HTTP_SHM = "http+shm"  # the rows' `protocol`: HTTP with tensors in system shared memory


def _median_rows(
    rows: list[dict[str, Any]], keys: tuple[str, ...], fields: tuple[str, ...]
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Group rows by *keys* (over repeats) and take the median of each numeric *field*."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    out = {}
    for key, members in groups.items():
        merged: dict[str, Any] = {"n": len(members)}
        for field in fields:
            values = [m[field] for m in members if isinstance(m.get(field), (int, float))]
            merged[field] = benchlib.median(values) if values else None
        out[key] = merged
    return out


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Medians over repeats, limits, ratios and the issue's targets."""
    inproc_m = _median_rows(results["inproc"], ("model", "options", "batch"), ("samples_per_s",))
    oceanus_m, grpc_m, shm_m = (
        _median_rows(
            [r for r in results["oceanus"] if r.get("protocol") == protocol],
            ("model", "concurrency"),
            ("throughput", "p50_ms", "p95_ms", "p99_ms", "mean_batch"),
        )
        for protocol in ("http", "grpc", HTTP_SHM)
    )
    naive_m = _median_rows(
        results["naive"], ("model", "concurrency"), ("throughput", "p50_ms", "p95_ms", "p99_ms")
    )
    limits: dict[str, Any] = {}
    for (model, options, batch), row in inproc_m.items():
        value = row["samples_per_s"]
        if value is None:  # skipped (too slow right now)
            continue
        entry = limits.setdefault(model, {})
        best = entry.get(options)
        if best is None or value > best["samples_per_s"]:
            entry[options] = {"samples_per_s": value, "batch": batch}
    for entry in limits.values():
        overall = max(entry.values(), key=lambda e: e["samples_per_s"])
        entry["limit"] = dict(overall, options=next(k for k, v in entry.items() if v is overall))
    # The recheck (same options and batch, measured after the Oceanus levels): the limit used
    # for the ratios is the mean of the sweep's best and the recheck (medians over repeats).
    recheck = _median_rows(results.get("inproc_recheck", []), ("model",), ("samples_per_s",))
    for (model,), row in recheck.items():
        entry = limits.get(model)
        if entry and row["samples_per_s"]:
            sweep = entry["limit"]["samples_per_s"]
            entry["limit"]["sweep_samples_per_s"] = sweep
            entry["limit"]["recheck_samples_per_s"] = row["samples_per_s"]
            entry["limit"]["samples_per_s"] = (sweep + row["samples_per_s"]) / 2
    rows = []
    for (model, level), row in sorted(oceanus_m.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        base_model = SAME_FILE.get(model, model)
        limit = limits.get(base_model, {}).get("limit")
        naive = naive_m.get((base_model, level))
        rows.append(
            {
                "model": model,
                "concurrency": level,
                **{k: row[k] for k in ("throughput", "p50_ms", "p95_ms", "p99_ms", "mean_batch")},
                "limit": limit["samples_per_s"] if limit else None,
                "limit_batch": limit["batch"] if limit else None,
                "vs_limit": row["throughput"] / limit["samples_per_s"]
                if limit and row["throughput"]
                else None,
                "naive": naive["throughput"] if naive else None,
                "naive_p50_ms": naive["p50_ms"] if naive else None,
                "vs_naive": row["throughput"] / naive["throughput"]
                if naive and naive["throughput"] and row["throughput"]
                else None,
                "repeats": row["n"],
            }
        )
    summary: dict[str, Any] = {
        "limits": limits,
        "oceanus_http": rows,
        "oceanus_grpc": [
            {"model": m, "concurrency": c, **v} for (m, c), v in sorted(grpc_m.items())
        ],
        "naive": [{"model": m, "concurrency": c, **v} for (m, c), v in sorted(naive_m.items())],
        "oceanus_http_shm": [
            {
                "model": m,
                "concurrency": c,
                **v,
                "vs_limit": v["throughput"] / limits[m]["limit"]["samples_per_s"]
                if v["throughput"] and m in limits
                else None,
            }
            for (m, c), v in sorted(shm_m.items())
        ],
    }
    summary["targets"] = targets(rows, results.get("latency", {}), summary["oceanus_grpc"])
    return summary


def _find(rows: list[dict[str, Any]], model: str, level: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["model"] == model and r["concurrency"] == level), None)


def targets(
    rows: list[dict[str, Any]], lat: dict[str, Any], grpc_rows: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    fmt = benchlib.fmt_num

    def add(
        name: str,
        value: float | None,
        goal: float,
        unit: str,
        higher: bool = True,
        extra: str = "",
        also: tuple[bool, str] | None = None,
    ) -> None:
        """*also*: a second condition (ok, what failed) that must hold too."""
        if value is None:
            out.append({"target": name, "status": "not measured", "note": extra})
            return
        met = value >= goal if higher else value < goal
        if met:
            status = "met"
        elif higher:
            status = (
                f"missed by {100 * (1 - value / goal):.0f}% (needs x{goal / value:.2f})"
                if value > 0
                else "missed (0)"
            )
        else:
            status = f"missed by {value - goal:.3g} {unit}"
        if also is not None and not also[0]:
            status = f"missed: {also[1]}" if met else f"{status}; also {also[1]}"
        out.append(
            {
                "target": name,
                "value": round(value, 4),
                "goal": goal,
                "unit": unit,
                "status": status,
                "note": extra,
            }
        )

    for model in TARGET_MODELS:
        row = _find(rows, model, 32)
        if row is None and model not in ("resnet50_onnx", "text_classifier_onnx"):
            continue  # the PyTorch/OpenVINO models are judged when they were run
        row = row or {}
        add(
            f"{model} c=32 >= 0.9 x in-process limit",
            row.get("vs_limit"),
            0.9,
            "x limit",
            extra=f"{fmt(row.get('throughput'))}/s vs limit {fmt(row.get('limit'))}/s "
            f"(batch {row.get('limit_batch')})"
            if row
            else "",
        )
    row = _find(rows, "resnet50_onnx", 32) or {}
    add(
        "resnet50_onnx c=32 >= 3 x naive",
        row.get("vs_naive"),
        3.0,
        "x naive",
        extra=f"{fmt(row.get('throughput'))}/s vs naive {fmt(row.get('naive'))}/s" if row else "",
    )
    for model in ("simple", "simple_dyna"):
        found = _find(rows, model, 16)
        if found is None:
            continue
        batch = found.get("mean_batch")
        add(
            f"{model} HTTP c=16 >= 6,000 infer/s with mean batch > 1",
            found.get("throughput"),
            6000,
            "infer/s",
            extra=f"mean batch {fmt(batch, 2)}",
            also=(bool(batch and batch > 1), f"mean batch {fmt(batch, 2)} is not > 1"),
        )
    # Issue 4 (gRPC): simple at c=16, and ResNet-50 at c=32 within 10 % of HTTP.
    found = _find(grpc_rows or [], "simple", 16)
    if found is not None:
        add("simple gRPC c=16 >= 4,000 infer/s", found.get("throughput"), 4000, "infer/s")
    found = _find(grpc_rows or [], "resnet50_onnx", 32)
    http = _find(rows, "resnet50_onnx", 32)
    if (
        found is not None
        and http is not None
        and found.get("throughput")
        and http.get("throughput")
    ):
        add(
            "resnet50_onnx gRPC c=32 >= 0.9 x HTTP c=32",
            found["throughput"] / http["throughput"],
            0.9,
            "x HTTP",
            extra=f"{fmt(found['throughput'])}/s vs HTTP {fmt(http['throughput'])}/s",
        )
    single = lat.get("single_request", {}).get("simple")
    if single:
        floor = single.get("http_ready_floor", {}).get("p50_ms")
        add(
            "simple c=1 server adds < 0.3 ms to in-process p50 (tritonclient.http)",
            single.get("http_adds_ms"),
            0.3,
            "ms",
            higher=False,
            extra=f"http p50 {fmt(single.get('http', {}).get('p50_ms'), 3)} ms vs in-process "
            f"{fmt(single['inproc_server_opts']['p50_ms'], 3)} ms; the same client's "
            f"GET /v2/health/ready takes {fmt(floor, 3)} ms",
        )
        found = _find(rows, "simple", 1)
        if found and found.get("p50_ms") is not None:
            adds = found["p50_ms"] - single["inproc_server_opts"]["p50_ms"]
            add(
                "simple c=1 server adds < 0.3 ms (perf_analyzer p50, C++ client)",
                adds,
                0.3,
                "ms",
                higher=False,
                extra=f"perf_analyzer c=1 p50 {fmt(found['p50_ms'], 3)} ms",
            )
    return out


def _print_rows(
    title: str, rows: list[dict[str, Any]], columns: list[tuple[str, str, int]]
) -> None:
    """A titled table of per-(model, concurrency) rows; columns: (header, key, digits)."""
    if not rows:
        return
    print(f"\n== {title}")
    cells = [
        [
            r["model"],
            r["concurrency"],
            *(benchlib.fmt_num(r[key], digits) for _, key, digits in columns),
        ]
        for r in rows
    ]
    print(benchlib.table(["model", "conc", *(header for header, _, _ in columns)], cells))


def print_report(results: dict[str, Any], summary: dict[str, Any]) -> None:
    fmt = benchlib.fmt_num
    print("\n== In-process, each model's framework (samples/s; median over repeats)")
    inproc_m = _median_rows(results["inproc"], ("model", "options", "batch"), ("samples_per_s",))
    models = sorted({k[0] for k in inproc_m})
    batches = sorted({k[2] for k in inproc_m})
    rows = []
    for model in models:
        for options in ("server", "default"):
            values = [inproc_m.get((model, options, b), {}).get("samples_per_s") for b in batches]
            if any(v is not None for v in values):
                rows.append([model, options, *(fmt(v) for v in values)])
    print(benchlib.table(["model", "options", *(f"b={b}" for b in batches)], rows))

    print(
        "\n== Oceanus, HTTP binary, N concurrent single-sample clients "
        f"({results['meta']['oceanus_loadgen']})"
    )
    rows = [
        [
            r["model"],
            r["concurrency"],
            fmt(r["throughput"]),
            fmt(r["p50_ms"], 2),
            fmt(r["p95_ms"]),
            fmt(r["p99_ms"]),
            fmt(r["mean_batch"], 2),
            fmt(r["limit"]),
            fmt(r["vs_limit"], 2),
            fmt(r["naive"]),
            fmt(r["vs_naive"], 2),
        ]
        for r in summary["oceanus_http"]
    ]
    print(
        benchlib.table(
            [
                "model",
                "conc",
                "infer/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "batch",
                "limit/s",
                "x limit",
                "naive/s",
                "x naive",
            ],
            rows,
        )
    )
    _print_rows(
        "Oceanus, gRPC (perf_analyzer -i grpc)",
        summary["oceanus_grpc"],
        [
            ("infer/s", "throughput", 1),
            ("p50 ms", "p50_ms", 2),
            ("p99 ms", "p99_ms", 1),
            ("batch", "mean_batch", 2),
        ],
    )
    _print_rows(
        "Oceanus, HTTP, tensors in system shared memory (perf_analyzer --shared-memory)",
        summary.get("oceanus_http_shm", []),
        [
            ("infer/s", "throughput", 1),
            ("p50 ms", "p50_ms", 2),
            ("batch", "mean_batch", 2),
            ("x limit", "vs_limit", 2),
        ],
    )
    _print_rows(
        "Naive FastAPI /predict (JSON, one at a time), bench/loadgen.py",
        summary["naive"],
        [
            ("req/s", "throughput", 1),
            ("p50 ms", "p50_ms", 2),
            ("p95 ms", "p95_ms", 1),
            ("p99 ms", "p99_ms", 1),
        ],
    )
    lat = results.get("latency", {})
    if lat.get("start_to_ready"):
        s = lat["start_to_ready"]
        print(
            f"\n== Start-to-ready (default example repository): median {s['median_s']:.2f} s "
            f"of {s['runs_s']}"
        )
    if lat.get("single_request"):
        print("\n== Single-request latency, p50 ms (sequential)")
        ways = ["inproc_server_opts", "inproc_default", "http", "grpc", "http_ready_floor"]
        rows = []
        for model, row in lat["single_request"].items():
            rows.append(
                [
                    model,
                    *(fmt(row.get(w, {}).get("p50_ms"), 3) for w in ways),
                    fmt(row.get("http_adds_ms"), 3),
                    fmt(row.get("grpc_adds_ms"), 3),
                ]
            )
        print(
            benchlib.table(
                [
                    "model",
                    "in-proc(server opts)",
                    "in-proc(default)",
                    "http",
                    "grpc",
                    "http GET ready",
                    "http adds",
                    "grpc adds",
                ],
                rows,
            )
        )
    print("\n== Targets")
    for t in summary["targets"]:
        value = t.get("value")
        print(
            f"- {t['target']}: {t['status']}"
            + (f" [{value:g} {t['unit']}]" if value is not None else "")
            + (f" {t['note']}" if t.get("note") else "")
        )
