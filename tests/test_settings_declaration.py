"""Each setting is declared once (oceanus/settings.py, issue 38): the command line, the
in-process keywords and each part's options all come from that declaration."""

from __future__ import annotations

import dataclasses

import pytest

import oceanus
import oceanus.tritonserver as tritonserver
from oceanus.cli import build_parser, parse_args
from oceanus.declaration import GROUPS, declared, default_of
from oceanus.embedded import InvalidArgumentError
from oceanus.parts import grpc_limits, grpc_options
from oceanus.settings import Settings

DECLARED = declared(Settings)


def test_every_field_given_at_init_is_a_declared_flag() -> None:
    given = {item.name for item in dataclasses.fields(Settings) if item.init}
    assert given == {item.name for item, _ in DECLARED}
    flags = [flag for _, setting in DECLARED for flag in setting.flags]
    assert len(flags) == len(set(flags))
    for _, setting in DECLARED:
        assert setting.help and setting.group in GROUPS
        assert all(flag.startswith("--") for flag in setting.flags)


def test_every_setting_is_in_help_in_its_group() -> None:
    text = build_parser().format_help()
    for _, setting in DECLARED:
        for flag in setting.flags:
            assert flag in text
    for group in GROUPS:
        assert f"\n{group}:\n" in text


def test_no_flags_no_keywords_and_the_declared_defaults_are_one_settings() -> None:
    from_flags, ignored = parse_args([])
    assert ignored == []
    assert from_flags == oceanus.Server().settings == Settings()
    for item, _ in DECLARED:
        if item.name != "metrics_address":  # "" is resolved, as --metrics-address says
            assert getattr(Settings(), item.name) == default_of(item)
    assert Settings().metrics_address == "0.0.0.0"


@pytest.mark.parametrize("item, setting", DECLARED, ids=[s.flags[0] for _, s in DECLARED])
def test_each_keyword_takes_its_default(item: dataclasses.Field[object], setting: object) -> None:
    keyword = item.metadata["setting"].keyword
    server = oceanus.Server(**{keyword: default_of(item)})
    assert getattr(server.settings, item.name) == getattr(Settings(), item.name)


@pytest.mark.parametrize(
    "flags, keywords",
    [
        (["--grpc-keepalive-time=1500"], {"grpc_keepalive_time": 1500}),
        (["--grpc-keepalive-time=1500"], {"grpc_keepalive_time": "1500"}),
        (["--model-store=a", "--model-store=b"], {"model_store": ["a", "b"]}),
        (["--id=x", "--strict-model-config"], {"id": "x", "strict_model_config": True}),
        (["--allow-grpc=false", "--disable-auto-complete-config"],
         {"allow_grpc": False, "disable_auto_complete_config": True}),
        (["--model-control-mode=EXPLICIT", "--load-model=m"],
         {"model_control_mode": "explicit", "load_model": "m"}),
        (["--http-restricted-api=health,metadata:k=v"],
         {"http_restricted_api": ["health,metadata:k=v"]}),
        (["--metrics-config=summary_latencies=true"],
         {"metrics_config": {"summary_latencies": "true"}}),
        (["--trace-config=rate=5", "--log-verbose=1"],
         {"trace_config": "rate=5", "log_verbose": 1}),
        (["--rate-limit=execution_count", "--rate-limit-resource=R:2"],
         {"rate_limit": "execution_count", "rate_limit_resource": ["R:2"]}),
        (["--frontend-workers=auto", "--openai-port=9000"],
         {"frontend_workers": "auto", "openai_port": 9000}),
    ],
)  # fmt: skip
def test_a_flag_and_its_keyword_are_the_same_setting(
    flags: list[str], keywords: dict[str, object]
) -> None:
    assert oceanus.Server(**keywords).settings == parse_args(flags)[0]


@pytest.mark.parametrize(
    "keywords, words",
    [
        (
            {"model_repo": "x"},
            "unknown server option 'model_repo'; did you mean 'model_repository'",
        ),
        ({"http_port": "abc"}, "'http_port' (--http-port): invalid port 'abc'"),
        ({"http_port": True}, "(--http-port): expected int, got bool"),
        ({"grpc_keepalive_time": -1}, "(--grpc-keepalive-time): value must be non-negative"),
        ({"exit_on_error": "maybe"}, "(--exit-on-error): invalid boolean value 'maybe'"),
        ({"load_model": [3]}, "(--load-model): expected str, got int"),
        ({"model_control_mode": "sometimes"}, "(--model-control-mode): invalid choice"),
        ({"cache_config": "local"}, "--cache-config expects"),
        ({"grpc_use_ssl": True}, "--grpc-use-ssl needs --grpc-server-cert"),
        ({"model_store": "a", "model_repository": "b"}, "given twice"),
    ],
)
def test_a_bad_keyword_names_itself_and_its_flag(keywords: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        oceanus.Server(**keywords)
    assert words in str(raised.value)


def test_an_ignored_tritonserver_flag_is_an_accepted_keyword() -> None:
    assert oceanus.Server(pinned_memory_pool_byte_size=1 << 20).settings == Settings()


def test_tritonserver_options_are_checked_as_the_flags() -> None:
    options = tritonserver.Options(model_repository="m", strict_model_config=True, log_verbose=1)
    settings = options._settings()
    assert not settings.autocomplete and settings.log.verbose == 1 and settings.log.info
    with pytest.raises(InvalidArgumentError, match="--model-load-thread-count"):
        tritonserver.Options(model_load_thread_count=-1)._settings()


def test_grpc_milliseconds_become_the_transports_seconds_once() -> None:
    settings, _ = parse_args(
        [
            "--grpc-keepalive-time=1500",
            "--grpc-keepalive-timeout=250",
            "--grpc-http2-min-recv-ping-interval-without-data=5000",
            "--grpc-max-connection-age=60000",
        ]
    )
    limits = grpc_limits(settings)
    assert (limits.keepalive_time_s, limits.keepalive_timeout_s) == (1.5, 0.25)
    assert (limits.min_ping_interval_s, limits.max_age_s, limits.age_grace_s) == (5, 60, None)
    channel = dict(grpc_options(settings).channel_options())  # grpc.aio's milliseconds
    assert channel["grpc.keepalive_time_ms"] == 1500
    assert channel["grpc.max_connection_age_ms"] == 60000
    assert "grpc.max_connection_age_grace_ms" not in channel
    assert grpc_limits(Settings()).keepalive_time_s == 7200  # Triton's two hours
