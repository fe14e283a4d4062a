"""Model repositories on object storage (s3://, gs://, as://), mirrored into a local folder.

Triton downloads a cloud repository into a local folder and loads from there; so does Oceanus:
`RepositorySet` turns the `--model-repository` values into local folders, and its `refresh()`
brings them up to date before each poll or explicit load. The core only ever sees folders.
"""

from oceanus.storage.locations import RemoteLocation, RepositoryError, is_remote, parse_location
from oceanus.storage.mirror import Mirror, RepositorySet

__all__ = [
    "Mirror",
    "RemoteLocation",
    "RepositoryError",
    "RepositorySet",
    "is_remote",
    "parse_location",
]
