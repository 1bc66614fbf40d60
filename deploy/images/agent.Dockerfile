# The node agent and the limiter hook. The agent uses cgo (go-nvml opens
# libnvidia-ml.so.1, which the NVIDIA runtime injects), so the base has
# glibc; it also has /bin/sh and cp for the DaemonSet's init container, which
# copies the hook to the node. The hook is built on an older glibc (Debian
# 11, glibc 2.31) than the agent, because every notebook process loads it:
# it then runs in notebook images with glibc 2.31 or newer.
# Build from the repository's root:
#   docker build -f deploy/images/agent.Dockerfile -t gpubroker-agent:dev .
FROM golang:1.26-trixie AS agent
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN deploy/images/build.sh agent /out

FROM debian:bullseye-slim AS hook
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev make && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY deploy/images/build.sh deploy/images/build.sh
COPY limiter/hook limiter/hook
RUN deploy/images/build.sh hook /out

FROM debian:trixie-slim
COPY --from=agent /out/gpubroker-agent /usr/local/bin/gpubroker-agent
COPY --from=hook /out/libgpulimit.so /opt/gpubroker/hook/libgpulimit.so
ENTRYPOINT ["/usr/local/bin/gpubroker-agent"]
