"""The gRPC transport: gRPC over HTTP/2 on the event loop, the gRPC frontend's default server.

Service-agnostic: it serves whatever `grpc.RpcMethodHandler`s it is given, by path, as grpc.aio
would, and imports nothing of the gRPC service (frontends/grpc/; an import-linter contract in
pyproject.toml holds this). Its rooms, each named for its job:
- `framing`: HTTP/2 frames for a gRPC server (RFC 9113), HPACK left to the `hpack` library;
- `events`: what the framing tells the connection (`Events`, which the connection implements);
- `defences`: per-connection flood budgets (frames that do no work, rapid resets, frames per
  loop turn, concurrent streams, header list and block limits);
- `headers`: HPACK both ways with memories of repeated blocks, and whether a request's header
  list is well formed (RFC 9113 8.2, 8.3);
- `connection`: one client connection, its calls, flow control, keepalive and ping policy,
  connection age and going away;
- `call`: one call, the servicer context its handler sees, and gRPC's wire details (message
  prefix, grpc-timeout, grpc-status and grpc-message, metadata);
- `server`: listening, TLS with ALPN "h2", the `Limits` the frontend's options set, stopping
  with or without a grace.

It owns the wire's limits and defences (docs/reliability.md lists them): the message limit
checked from a message's length prefix before it is buffered and after inflating, headers of at
most 64 KiB and bounded CONTINUATION chains, bounded receive windows, grpc core's ping strikes
(GOAWAY ENHANCE_YOUR_CALM), streams refused once going away, a streaming call's writer held
while the peer does not read, and every handler cancelled when its client resets or leaves.
"""
