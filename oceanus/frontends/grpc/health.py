"""The two messages of the standard `grpc.health.v1.Health` service, declared by hand.

The schema is tiny and frozen (grpc/grpc-proto health/v1/health.proto), so it is built here from a
descriptor rather than bringing in the grpcio-health-checking package.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE_NAME = "grpc.health.v1.Health"

# HealthCheckResponse.ServingStatus
UNKNOWN = 0
SERVING = 1
NOT_SERVING = 2
SERVICE_UNKNOWN = 3


def _build() -> tuple[Any, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="oceanus/grpc/health/v1/health.proto", package="grpc.health.v1", syntax="proto3"
    )
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(
        name="service",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for name, number in (
        ("UNKNOWN", UNKNOWN),
        ("SERVING", SERVING),
        ("NOT_SERVING", NOT_SERVING),
        ("SERVICE_UNKNOWN", SERVICE_UNKNOWN),
    ):
        status.value.add(name=name, number=number)
    response.field.add(
        name="status",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    # A private pool: another module (grpcio-health-checking) may register the real file.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    messages = message_factory.GetMessages([proto], pool=pool)
    return (
        messages["grpc.health.v1.HealthCheckRequest"],
        messages["grpc.health.v1.HealthCheckResponse"],
    )


HealthCheckRequest, HealthCheckResponse = _build()
