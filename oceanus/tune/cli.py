"""`oceanus tune MODEL`: find the instance count, batch sizes and queue delay that serve the
most within a latency budget, measured on this machine (docs/tune.md)."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from oceanus.core.repository.model_config import parse_config_text
from oceanus.tune import loadgen, output
from oceanus.tune import perf_analyzer as pa
from oceanus.tune.measure import Meter
from oceanus.tune.progress import Clock, Progress
from oceanus.tune.report import RunInfo
from oceanus.tune.space import Space
from oceanus.tune.sweep import Outcome, Sweep
from oceanus.tune.target import ManagedServer, Target, TuneError

# Seconds the server, the model's first load and the side-by-side need at the least.
MIN_SECONDS = 12.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"oceanus tune: error: {message} (see 'oceanus tune --help')\n")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="oceanus tune",
        description="Sweep a model's instance count, max batch size, preferred batch sizes and "
        "max queue delay under rising concurrency, find the throughput/latency frontier, and "
        "recommend the configuration that serves the most within the latency budget.",
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("model", metavar="MODEL", help="the model to tune (its folder name)")
    add(
        "--model-repository",
        metavar="PATH",
        help="repository holding MODEL (default: the built-in examples)",
    )
    add(
        "--url",
        metavar="HOST:PORT",
        help="tune on a running server's HTTP endpoint (started with "
        "--model-control-mode=explicit) instead of starting one",
    )
    add(
        "--latency-budget-ms",
        type=_positive,
        default=100.0,
        metavar="MS",
        help="the p99 latency a configuration may reach (default 100)",
    )
    add(
        "--max-minutes",
        type=_positive,
        default=10.0,
        metavar="MIN",
        help="time for the whole run, server start included (default 10)",
    )
    add("--output-dir", metavar="PATH", help="where to write (default ./oceanus-tune-MODEL)")
    add(
        "--apply",
        action="store_true",
        help="write the recommended config over MODEL/config.pbtxt (the old one kept as "
        "config.pbtxt.bak)",
    )
    add(
        "--load-generator",
        choices=("auto", "perf_analyzer", "built-in"),
        default="auto",
        help="auto: perf_analyzer when it is found and runs, else the built-in one",
    )
    add("--perf-analyzer", default="", metavar="PATH", help="the perf_analyzer binary")
    add(
        "--max-concurrency",
        type=int,
        default=128,
        metavar="N",
        help="the highest concurrency tried (default 128)",
    )
    return parser


def _repository(args: argparse.Namespace) -> Path | None:
    if args.model_repository:
        repository = Path(args.model_repository).expanduser().resolve()
    elif args.url:
        return None
    else:
        from oceanus.examples import EXAMPLE_MODELS, example_repository

        if args.model not in EXAMPLE_MODELS:
            raise TuneError(
                f"'{args.model}' is not a built-in example model ({', '.join(EXAMPLE_MODELS)}); "
                "name its repository with --model-repository"
            )
        repository = example_repository([args.model])
    if not (repository / args.model).is_dir():
        raise TuneError(f"no model folder '{args.model}' in {repository}")
    return repository


def _file_config(
    repository: Path | None, model: str, normalized: mc.ModelConfig
) -> tuple[mc.ModelConfig, str]:
    """The config as the user wrote it (and its text), or the server's normalized one."""
    path = repository / model / "config.pbtxt" if repository is not None else None
    if path is not None and path.is_file():
        text = path.read_text()
        return parse_config_text(text, str(path)), text
    return normalized, output.config_text(normalized)


def _perf_analyzer(
    args: argparse.Namespace,
    target: Target,
    model: str,
    metadata: dict[str, object],
    max_batch_size: int,
    say: Progress,
) -> pa.PerfAnalyzer | None:
    if args.load_generator == "built-in":
        return None
    binary = pa.find(args.perf_analyzer)
    problem = "not found (--perf-analyzer PATH, $PERF_ANALYZER, PATH or $PA_VENV)"
    if binary is not None:
        try:
            say(f"load generator: {pa.version(binary)} ({binary})")
            return pa.PerfAnalyzer(
                binary, model, target.address, pa.shape_flags(metadata, max_batch_size)
            )
        except RuntimeError as exc:
            problem = f"at {binary} does not run: {exc}"
    if args.load_generator == "perf_analyzer":
        raise TuneError(f"perf_analyzer {problem}")
    say(f"load generator: built-in (perf_analyzer {problem})")
    return None


def _window(seconds: float) -> float:
    """Seconds per measurement: longer runs measure longer (0.3 to 2 s)."""
    return round(min(2.0, max(0.3, seconds / 180.0)), 2)


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def tune(args: argparse.Namespace, clock: Clock, say: Progress) -> int:
    model = args.model
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    load_before = _load_average()
    folder = Path(args.output_dir or f"oceanus-tune-{model}")
    if args.apply and not args.model_repository:
        raise TuneError("--apply needs --model-repository (the built-in examples are generated)")
    repository = _repository(args)
    server = None
    if args.url:
        target = Target(args.url)
        where = f"at {target.address}"
    else:
        assert repository is not None
        server = ManagedServer(repository, model, folder / "server.log")
        target = server.target
        where = "started by oceanus tune"
    try:
        if server is not None:
            server.start(timeout_s=max(5.0, clock.left() - MIN_SECONDS))
            say(f"server ready at {target.address}; watch it live at {target.metrics_url}")
        if not target.ready(model):
            target.load(model)
        normalized = json_format.ParseDict(
            target.model_config(model), mc.ModelConfig(), ignore_unknown_fields=True
        )
        if normalized.platform == "ensemble":
            raise TuneError("an ensemble has no instances or batching of its own: tune its models")
        if normalized.model_transaction_policy.decoupled:
            raise TuneError("decoupled models stream their answers, which tune does not measure")
        metadata = target.model_metadata(model)
        space = Space(normalized, args.latency_budget_ms)
        if load_before is not None and load_before > space.cpus:
            say(
                f"the machine is busy (load average {load_before:.1f} on {space.cpus} CPUs): "
                "single measurements will be noisy"
            )
        meter = Meter(
            target,
            model,
            loadgen.build_request(model, metadata, normalized.max_batch_size, target.host),
            _perf_analyzer(args, target, model, metadata, normalized.max_batch_size, say),
        )
        window = _window(args.max_minutes * 60)
        sweep = Sweep(
            target,
            model,
            normalized,
            space,
            meter,
            args.latency_budget_ms,
            clock,
            window,
            args.max_concurrency,
            say,
        )
        outcome = sweep.run()
    finally:
        if server is not None:
            server.stop()
        elif target.live():
            try:
                target.load(model)  # leave a running server with its own config again
            except TuneError as exc:
                say(f"could not reload the shipped config: {exc}")
    file_config, shipped_text = _file_config(repository, model, normalized)
    load_after = _load_average()
    info = RunInfo(
        model=model,
        budget_ms=args.latency_budget_ms,
        max_minutes=args.max_minutes,
        elapsed_s=clock.elapsed(),
        cpus=space.cpus,
        generator=meter.generator,
        started=started,
        server=where,
        window_s=window,
        load=(load_before, load_after)
        if load_before is not None and load_after is not None
        else None,
    )
    text = output.write_all(outcome, info, folder, file_config, shipped_text)
    _finish(outcome, args, folder, repository, text, say)
    return 0 if outcome.recommended is not None else 1


def _finish(
    outcome: Outcome,
    args: argparse.Namespace,
    folder: Path,
    repository: Path | None,
    text: str | None,
    say: Progress,
) -> None:
    for note in outcome.notes:
        say(note)
    recommended = outcome.recommended
    if recommended is not None:
        shipped, chosen = outcome.shipped_score, outcome.recommended_score
        gain = f" ({chosen / shipped - 1:+.0%})" if chosen and shipped else ""
        print(
            f"recommended: #{recommended.id} {recommended.candidate.label()}: "
            f"{chosen or 0:,.0f} infer/s against the shipped {shipped or 0:,.0f}{gain} "
            f"at p99 <= {args.latency_budget_ms:g} ms"
        )
    written = ["report.html", "measurements.csv", "measurements.json"]
    if text is not None:
        written.insert(0, "config.pbtxt")
    print(f"wrote {', '.join(str(folder / name) for name in written)}")
    if args.apply and text is not None and repository is not None:
        backup = output.apply_config(repository / args.model, text)
        print(f"applied: {repository / args.model / 'config.pbtxt'} (was kept as {backup.name})")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    clock = Clock(args.max_minutes * 60)
    say = Progress(clock)
    if args.max_minutes * 60 < MIN_SECONDS:
        print(
            f"oceanus tune: error: --max-minutes must allow at least {MIN_SECONDS:g} s",
            file=sys.stderr,
        )
        return 2
    say(f"tuning '{args.model}': p99 <= {args.latency_budget_ms:g} ms, {args.max_minutes:g} min")
    try:
        return tune(args, clock, say)
    except TuneError as exc:
        print(f"oceanus tune: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("oceanus tune: interrupted", file=sys.stderr)
        return 130
