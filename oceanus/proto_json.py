"""Protobuf messages to JSON-ready dicts the way Triton prints model configs.

Triton prints configs with proto field names, every field that has no presence (scalars, repeated,
maps) even when default, enums as names, and 64-bit integers as JSON numbers (protobuf's own
JSON printer would quote them). Singular message fields appear only when set.
"""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

_FD = FieldDescriptor


def message_to_dict(message: Message) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            result[field.name] = {str(k): _scalar(value_field, v) for k, v in value.items()}
        elif _is_repeated(field):
            result[field.name] = [_scalar(field, v) for v in value]
        elif field.type == _FD.TYPE_MESSAGE or field.containing_oneof is not None:
            if message.HasField(field.name):
                result[field.name] = _scalar(field, value)
        else:
            result[field.name] = _scalar(field, value)
    return result


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 6.32 deprecates `label` in favour of `is_repeated`; older releases lack it.
    repeated = getattr(field, "is_repeated", None)
    if repeated is None:
        return bool(field.label == _FD.LABEL_REPEATED)
    return bool(repeated)


def _is_map(field: FieldDescriptor) -> bool:
    return bool(
        field.type == _FD.TYPE_MESSAGE
        and field.message_type.has_options
        and field.message_type.GetOptions().map_entry
    )


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == _FD.TYPE_MESSAGE:
        return message_to_dict(value)
    if field.type == _FD.TYPE_ENUM:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if field.type == _FD.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value
