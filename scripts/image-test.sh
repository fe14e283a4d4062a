#!/usr/bin/env bash
# Build the Dockerfile and serve inference from the image, with no Docker daemon and no image
# pulls (CI reaches only PyPI, Debian and npm): mmdebstrap makes a Debian bookworm root
# filesystem with python3 as the base image, buildah (vfs storage, chroot isolation) builds the
# Dockerfile on it, then runs the image's tritonserver as uid 1000 on a generated repository
# and checks an inference answer. Takes ~3 minutes (mmdebstrap ~20 s, build ~2 min).
# scripts/test.sh runs it once; OCEANUS_SKIP_IMAGE_TEST=1 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in mmdebstrap buildah curl; do
  command -v "$tool" >/dev/null || { echo "image-test: $tool is missing (scripts/deploy-tools.sh)"; exit 1; }
done
started=$SECONDS
work=$(mktemp -d)
buildah=(buildah --storage-driver vfs)
ctr=""
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null || true
  [ -n "$ctr" ] && "${buildah[@]}" rm "$ctr" >/dev/null 2>&1 || true
  "${buildah[@]}" rmi -f localhost/oceanus:image-test localhost/oceanus-base:image-test >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$work/rootfs.tar" http://deb.debian.org/debian
base=$("${buildah[@]}" from scratch)
"${buildah[@]}" add "$base" "$work/rootfs.tar" / >/dev/null
"${buildah[@]}" commit -q "$base" localhost/oceanus-base:image-test >/dev/null
"${buildah[@]}" rm "$base" >/dev/null
echo "image-test: base root filesystem in $((SECONDS - started)) s"
secret=()
# Behind a TLS-intercepting proxy pip needs the machine's CA bundle (a build secret, not a layer).
[ -f /etc/ssl/certs/ca-certificates.crt ] && secret=(--secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt)
"${buildah[@]}" build -q --format docker --isolation chroot --network host "${secret[@]}" \
  --build-arg BASE_IMAGE=localhost/oceanus-base:image-test -t localhost/oceanus:image-test . >/dev/null
echo "image-test: image built in $((SECONDS - started)) s"
python3 -m oceanus.examples --models simple "$work/models" >/dev/null
chmod -R a+rX "$work"
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
ctr=$("${buildah[@]}" from localhost/oceanus:image-test)
"${buildah[@]}" run --isolation chroot --network host --user 1000:1000 -v "$work/models:/models:ro" "$ctr" -- \
  tritonserver --model-repository=/models --http-address=127.0.0.1 --http-port="$port" \
  --grpc-port=0 --allow-grpc=false --allow-metrics=false >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && break
  sleep 0.5
done
answer=$(curl -sf -X POST "http://127.0.0.1:$port/v2/models/simple/infer" -d '{"inputs": [
  {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},
  {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}') || {
  echo "image-test: no inference answer"; tail -20 "$work/server.log"; exit 1; }
case "$answer" in
  *'"data":[2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]'*) ;;
  *) echo "image-test: wrong answer: $answer"; exit 1 ;;
esac
echo "image-test: the image served inference; $((SECONDS - started)) s in all"
