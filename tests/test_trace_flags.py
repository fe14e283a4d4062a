"""tritonserver's trace flags, read as Triton reads them (oceanus/trace_flags.py)."""

from __future__ import annotations

import pytest

from oceanus.cli import parse_args
from oceanus.core.observability.tracing import LEVEL_OFF, LEVEL_TENSORS, LEVEL_TIMESTAMPS


def test_trace_config_settings() -> None:
    settings, ignored = parse_args(
        [
            "--trace-config=level=TIMESTAMPS",
            "--trace-config=level=TENSORS",
            "--trace-config=rate=10",
            "--trace-config=count=5",
            "--trace-config=triton,file=/tmp/t.json",
            "--trace-config=triton,log-frequency=3",
        ]
    )
    trace = settings.trace
    assert trace.level == LEVEL_TIMESTAMPS | LEVEL_TENSORS
    assert (trace.rate, trace.count, trace.log_frequency) == (10, 5, 3)
    assert (trace.file, trace.mode) == ("/tmp/t.json", "triton")
    assert "--trace-config" not in ignored


def test_deprecated_flags_and_precedence() -> None:
    settings, _ = parse_args(
        ["--trace-file=/tmp/a.json", "--trace-level=max", "--trace-rate=7", "--trace-count=2"]
    )
    trace = settings.trace
    assert (trace.file, trace.level, trace.rate, trace.count) == (
        "/tmp/a.json",
        LEVEL_TIMESTAMPS,
        7,
        2,
    )
    # --trace-config wins over the deprecated flag, and any level OFF disables tracing.
    settings, _ = parse_args(
        ["--trace-rate=7", "--trace-config=rate=9", "--trace-level=TIMESTAMPS", "--trace-level=OFF"]
    )
    assert settings.trace.rate == 9 and settings.trace.level == LEVEL_OFF


def test_opentelemetry_mode_gets_the_batch_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    settings, _ = parse_args(
        [
            "--trace-config=mode=opentelemetry",
            "--trace-config=opentelemetry,url=http://collector:4318/v1/traces",
            "--trace-config=opentelemetry,bsp_max_queue_size=10",
            "--trace-config=triton,file=/tmp/ignored.json",
        ]
    )
    trace = settings.trace
    assert trace.mode == "opentelemetry" and trace.file == ""
    assert dict(trace.mode_options) == {
        "url": "http://collector:4318/v1/traces",
        "bsp_max_queue_size": "10",
        "bsp_schedule_delay": "250",
        "bsp_max_export_batch_size": "512",
    }


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--trace-config=level=LOUD", "invalid value for trace level option: loud"),
        (
            "--trace-config=jaeger,url=x",
            'invalid value for trace mode option: jaeger. Available options are "triton" and '
            '"opentelemetry"',
        ),
        (",rate=1", "No trace mode specified."),
        ("--trace-config=rate", "--trace-config option format is"),
        ("--trace-config=rate=often", 'Bad option: "--trace-config rate".'),
    ],
)
def test_bad_flags_stop_the_server_with_tritons_words(
    flag: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parser `python -m oceanus` runs: exit 2 with Triton's words."""
    argument = flag if flag.startswith("--") else f"--trace-config={flag}"
    with pytest.raises(SystemExit) as exited:
        parse_args([argument])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
