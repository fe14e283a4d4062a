"""What a model's `initialize(args)` receives, as Triton's stub gives it: built from the load
context on the server side, for the stub (instance.py) and the in-process mode (in_process.py)."""

from __future__ import annotations

import json

from oceanus.core.backend import LoadContext
from oceanus.proto_json import message_to_dict


def initialize_args(context: LoadContext) -> dict[str, str]:
    """What `initialize(args)` gets, as Triton's stub gives it."""
    config, spec, version_dir = context.config, context.spec, context.files.model_path.parent
    return {
        "model_config": json.dumps(message_to_dict(config)),
        "model_instance_kind": spec.kind,
        "model_instance_name": spec.name,
        "model_instance_device_id": str(spec.device_id),
        "model_repository": str(version_dir.parent),
        "model_version": version_dir.name,
        "model_name": config.name,
    }
