"""Triton's defaults for the gRPC keepalive and HTTP/2 ping flags (times in milliseconds): one
definition for the command line, the settings and the frontend. No grpc import, so the command
line stays cheap to parse."""

KEEPALIVE_TIME_MS = 7_200_000
KEEPALIVE_TIMEOUT_MS = 20_000
HTTP2_MAX_PINGS_WITHOUT_DATA = 2
HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS = 300_000
HTTP2_MAX_PING_STRIKES = 2
