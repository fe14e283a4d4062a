"""Model repositories on object storage, against real API servers on loopback: moto's S3 server
and gcp-storage-emulator. Repositories load and serve; a version uploaded while the server runs
is picked up by poll and explicit modes with no failed request; an unreadable repository is a
clear start-up error naming its URL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import tritonclient.http as httpclient

from oceanus.storage import RepositoryError, is_remote, parse_location
from tests.conftest import free_port

BOTO_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class Store:
    """A bucket on a loopback server: what to pass to Oceanus, and a filesystem to upload with."""

    kind: str
    url: str  # the repository URL (prefix included)
    fs: Any
    path: str  # the same place as the filesystem names it
    env: dict[str, str]

    def upload(self, local: Path, relative: str) -> None:
        self.fs.put(str(local), f"{self.path}/{relative}", recursive=local.is_dir())


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="module")
def gcs_endpoint() -> Iterator[str]:
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def s3_store(endpoint: str, bucket: str, prefix: str) -> Store:
    fs = fsspec.filesystem(
        "s3",
        skip_instance_cache=True,
        endpoint_url=f"http://{endpoint}",
        key="testing",
        secret="testing",
        client_kwargs={"region_name": "us-east-1"},
    )
    if not fs.exists(bucket):
        import boto3

        boto3.client(
            "s3", endpoint_url=f"http://{endpoint}", region_name="us-east-1", **BOTO_KEYS
        ).create_bucket(Bucket=bucket)
    return Store("s3", f"s3://{endpoint}/{bucket}/{prefix}", fs, f"{bucket}/{prefix}", S3_ENV)


def gcs_store(endpoint: str, bucket: str, prefix: str) -> Store:
    # gcsfs reads STORAGE_EMULATOR_HOST when imported: name the endpoint explicitly here.
    from gcsfs.core import GCSFileSystem  # the plain one: no gRPC bucket-type probe

    fs = GCSFileSystem(skip_instance_cache=True, token="anon", endpoint_url=endpoint)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    env = {"STORAGE_EMULATOR_HOST": endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    return Store("gs", f"gs://{bucket}/{prefix}", fs, f"{bucket}/{prefix}", env)


def infer_simple(url: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return client.infer("simple", inputs).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def upload_simple(store: Store, model_repository: Path, version: int = 1) -> None:
    model = model_repository / "simple"
    if version == 1:
        store.upload(model / "config.pbtxt", "simple/config.pbtxt")
    store.upload(model / "1" / "model.onnx", f"simple/{version}/model.onnx")


# ---- the URL forms ------------------------------------------------------------------------


def test_triton_url_forms() -> None:
    assert parse_location("s3://bucket/models").path == "bucket/models"
    assert parse_location("s3://bucket/models").options.get("endpoint_url") is None
    minio = parse_location("s3://minio.local:9000/bucket/models/")
    assert (minio.path, minio.options["endpoint_url"]) == (
        "bucket/models",
        "http://minio.local:9000",
    )
    secure = parse_location("s3://https://10.0.0.1:443/bucket")
    assert (secure.path, secure.options["endpoint_url"]) == ("bucket", "https://10.0.0.1:443")
    assert parse_location("gs://bucket/a/b").path == "bucket/a/b"
    azure = parse_location("as://account/container/models")
    assert (azure.path, azure.options["account_name"]) == ("container/models", "account")
    assert is_remote("gs://b") and not is_remote("/models") and not is_remote("file:///models")
    for bad in ("s3://", "as://account", "gs://"):
        with pytest.raises(RepositoryError, match="expected"):
            parse_location(bad)


# ---- serving from a bucket ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_repository_in_a_bucket_loads_and_serves(
    kind: str,
    s3_endpoint: str,
    gcs_endpoint: str,
    model_repository: Path,
    tmp_path: Path,
    launch: Any,
) -> None:
    if kind == "s3":
        store = s3_store(s3_endpoint, "serve", "repo")
    else:
        store = gcs_store(gcs_endpoint, "serve", "repo")
    upload_simple(store, model_repository)
    mount = tmp_path / "mount"
    mount.mkdir()
    variable = "TRITON_AWS_MOUNT_DIRECTORY" if kind == "s3" else "TRITON_GCS_MOUNT_DIRECTORY"
    server = launch([store.url], env={**store.env, variable: str(mount)})
    np.testing.assert_array_equal(infer_simple(server.http_url)[0], np.arange(16) * 2)
    assert (mount / "serve" / "repo" / "simple" / "1" / "model.onnx").is_file()


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_new_version_in_the_bucket_is_picked_up_with_no_failed_request(
    mode: str, s3_endpoint: str, model_repository: Path, launch: Any
) -> None:
    store = s3_store(s3_endpoint, "versions", mode)
    upload_simple(store, model_repository)
    args = ["--model-control-mode=" + mode]
    args += ["--repository-poll-secs=1"] if mode == "poll" else ["--load-model=simple"]
    server = launch([store.url], args, env=store.env)
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_model_metadata("simple")["versions"] == ["1"]

    failures: list[str] = []
    served = 0
    stop = threading.Event()

    def load() -> None:
        nonlocal served
        while not stop.is_set():
            try:
                infer_simple(server.http_url)
                served += 1
            except Exception as exc:
                failures.append(repr(exc))

    thread = threading.Thread(target=load)
    thread.start()
    try:
        upload_simple(store, model_repository, version=2)
        if mode == "explicit":
            client.load_model("simple")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if client.get_model_metadata("simple")["versions"] == ["2"]:
                break
            time.sleep(0.1)
        served_at_switch = served
        deadline = time.monotonic() + 30
        while served < served_at_switch + 20 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(30)
    assert client.get_model_metadata("simple")["versions"] == ["2"], server.log()
    assert failures == []
    assert served > served_at_switch


# ---- clear errors -------------------------------------------------------------------------


def start_failing(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oceanus", f"--model-repository={url}", "--allow-http=false"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_missing_bucket_is_an_error_naming_the_url(s3_endpoint: str) -> None:
    url = f"s3://{s3_endpoint}/no-such-bucket/models"
    result = start_failing(url, S3_ENV)
    assert result.returncode == 1
    assert f"failed to read model repository '{url}': not found" in result.stderr


def test_bad_credentials_are_an_error_naming_the_url(tmp_path: Path) -> None:
    # moto checks signatures only when asked: with no unauthenticated actions allowed, any key
    # that is not one of its IAM users is refused, as AWS refuses it.
    port = free_port()
    server = subprocess.Popen(
        ["moto_server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        import socket

        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        url = f"s3://127.0.0.1:{port}/models/repo"
        result = start_failing(url, {**S3_ENV, "AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG1"})
    finally:
        server.terminate()
        server.wait(10)
    assert result.returncode == 1
    assert f"failed to read model repository '{url}': access denied" in result.stderr
