#!/bin/sh
# build.sh TARGET OUT builds into the directory OUT what an image holds, from
# the repository's root:
#   broker  OUT/gpubroker        the production broker: static, CGO_ENABLED=0
#   agent   OUT/gpubroker-agent  the node agent (cgo: go-nvml loads NVML)
#   hook    OUT/libgpulimit.so   the limiter hook (C)
# The Dockerfiles run it in their build stages; deploy/images' test runs it
# too and checks the outputs and the Dockerfiles' COPY lines against each
# other.
set -eu
if [ $# -ne 2 ]; then
	echo "usage: $0 broker|agent|hook OUT" >&2
	exit 2
fi
target=$1 out=$2
mkdir -p "$out"
case "$target" in
broker)
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/gpubroker" ./broker/cmd/gpubroker
	;;
agent)
	# go-nvml's cgo preamble declares NVML 13 deprecations; they are not ours.
	CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}" \
		go build -trimpath -o "$out/gpubroker-agent" ./limiter/cmd/gpubroker-agent
	;;
hook)
	make -s -C limiter/hook build/libgpulimit.so
	cp limiter/hook/build/libgpulimit.so "$out/libgpulimit.so"
	;;
*)
	echo "$0: unknown target $target (broker, agent or hook)" >&2
	exit 2
	;;
esac
