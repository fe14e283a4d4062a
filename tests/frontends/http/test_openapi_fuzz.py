"""schemathesis over Oceanus' own OpenAPI description of its HTTP API (docs/openapi.yaml): no
request built from it, valid or not, gets a 5xx (issue 18). Bounded for CI; raise
OPENAPI_EXAMPLES for a longer run. One server for the module, in explicit model-control mode so
that random load and unload requests are answered as the client's mistakes they are."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

SCHEMA = schemathesis.openapi.from_path(
    str(Path(__file__).resolve().parents[3] / "docs" / "openapi.yaml")
)
EXAMPLES = int(os.environ.get("OPENAPI_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def oceanus(model_repository: Path, launch_module: Any) -> Any:
    return launch_module([model_repository], ["--model-control-mode=explicit", "--load-model=*"])


@SCHEMA.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_request_gets_a_server_error(case: Any, oceanus: Any) -> None:
    case.call_and_validate(base_url=f"http://{oceanus.http_url}", checks=[not_a_server_error])
