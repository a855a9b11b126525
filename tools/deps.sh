#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# deps.sh: make sure the build dependencies are present (libyaml and Check
# headers), installing them with apt-get when they are missing
# and we may. The CUDA toolkit (NVRTC, cuda.h) must already be installed.
set -eu
cc=${CC:-cc}
missing=()
for pkg in "yaml.h:libyaml-dev" "check.h:check"; do
  header=${pkg%%:*}
  echo "#include <$header>" | "$cc" ${CPATH:+-I${CPATH//:/ -I}} -E - >/dev/null 2>&1 || missing+=("${pkg##*:}")
done
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/nvrtc.h" ]; then
  echo "deps: the CUDA toolkit was not found at $cuda (set CUDA_HOME)" >&2
  exit 1
fi
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=
[ "$(id -u)" -eq 0 ] || sudo=sudo
echo "deps: installing ${missing[*]}"
$sudo apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
