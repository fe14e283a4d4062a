"""Triton's spellings of cloud model repositories, and the filesystem each one opens.

- `s3://bucket/prefix`: Amazon S3; credentials and region from the AWS environment variables
  (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, AWS_PROFILE)
  or the AWS config files, as botocore reads them.
- `s3://host:port/bucket/prefix` (and `s3://https://host:port/...`): an S3-compatible server
  such as MinIO, over HTTP unless the host is prefixed with https://.
- `gs://bucket/prefix`: Google Cloud Storage; GOOGLE_APPLICATION_CREDENTIALS, else the attached
  service account, else anonymous (gcsfs's default chain). STORAGE_EMULATOR_HOST points it at an
  emulator.
- `as://account/container/prefix`: Azure Blob Storage; AZURE_STORAGE_KEY (shared key) for the
  account, else Azure's default credential chain.

Each kind is mirrored into the folder named by its TRITON_*_MOUNT_DIRECTORY variable, or into a
temporary folder removed at exit (Triton's behaviour).
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass, field
from typing import Any

# s3://[http(s)://]host:port/bucket/prefix  (Triton's form for S3-compatible servers)
_S3_ENDPOINT = re.compile(r"^(?:(https?)://)?([A-Za-z0-9\-.]+):([0-9]+)/(.*)$")

_SCHEMES = {
    # scheme: (fsspec protocol, the package that provides it, pip extra, mount variable)
    "s3": ("s3", "s3fs", "s3", "TRITON_AWS_MOUNT_DIRECTORY"),
    "gs": ("gcs", "gcsfs", "gcs", "TRITON_GCS_MOUNT_DIRECTORY"),
    "as": ("abfs", "adlfs", "azure", "TRITON_AZURE_MOUNT_DIRECTORY"),
}


class RepositoryError(Exception):
    """A model repository that cannot be read; the message names its URL."""


@dataclass(frozen=True)
class RemoteLocation:
    url: str  # as given on the command line
    scheme: str  # s3 | gs | as
    path: str  # "bucket/prefix" as the filesystem names it
    options: dict[str, Any] = field(default_factory=dict)  # the filesystem's constructor

    @property
    def mount_variable(self) -> str:
        return _SCHEMES[self.scheme][3]

    def filesystem(self) -> Any:
        """A fresh fsspec filesystem for this location (no shared listing cache)."""
        protocol, package, extra, _ = _SCHEMES[self.scheme]
        if self.scheme == "gs" and "endpoint_url" in self.options:
            # gcsfs asks a gRPC control API for each bucket's type, which emulators lack (a
            # 60 s timeout per bucket); read when gcsfs is imported.
            os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        try:
            importlib.import_module(package)
        except ImportError:
            raise RepositoryError(
                f"model repository '{self.url}' needs the {package} package: "
                f"pip install 'oceanus[{extra}]'"
            ) from None
        import fsspec

        return fsspec.filesystem(protocol, skip_instance_cache=True, **self.options)


def is_remote(path: str) -> bool:
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme in _SCHEMES


def parse_location(url: str) -> RemoteLocation:
    """The remote location a `--model-repository` value names; RepositoryError when malformed."""
    scheme, _, rest = url.partition("://")
    rest = rest.rstrip("/")
    if scheme == "s3":
        return _s3(url, rest)
    if scheme == "gs":
        if not rest:
            raise RepositoryError(f"model repository '{url}': expected gs://bucket[/path]")
        gcs_options: dict[str, Any] = {}
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            gcs_options["endpoint_url"] = emulator
            if not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
                gcs_options["token"] = "anon"  # an emulator wants none (no metadata probe)
        return RemoteLocation(url, "gs", rest, gcs_options)
    if scheme == "as":
        account, _, container_path = rest.partition("/")
        if not account or not container_path:
            raise RepositoryError(
                f"model repository '{url}': expected as://account/container[/path]"
            )
        options: dict[str, Any] = {"account_name": account}
        if os.environ.get("AZURE_STORAGE_KEY"):
            options["account_key"] = os.environ["AZURE_STORAGE_KEY"]
        else:
            options["anon"] = False  # Azure's default credential chain (managed identity, ...)
        return RemoteLocation(url, "as", container_path, options)
    raise RepositoryError(f"model repository '{url}': unknown scheme '{scheme}://'")


def _s3(url: str, rest: str) -> RemoteLocation:
    options: dict[str, Any] = {}
    endpoint = _S3_ENDPOINT.match(rest)
    if endpoint is not None:
        protocol, host, port, rest = endpoint.groups()
        options["endpoint_url"] = f"{protocol or 'http'}://{host}:{port}"
    if not rest:
        raise RepositoryError(
            f"model repository '{url}': expected s3://bucket[/path] or s3://host:port/bucket[/path]"
        )
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    if region:
        options["client_kwargs"] = {"region_name": region}
    return RemoteLocation(url, "s3", rest, options)
