# The production broker: the static, cgo-free gpubroker binary (no
# simulation linked in) on a distroless base, as user 65532 (the chart's
# runAsUser). Build from the repository's root:
#   docker build -f deploy/images/broker.Dockerfile -t gpubroker:dev .
FROM golang:1.26-trixie AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN deploy/images/build.sh broker /out

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gpubroker /usr/local/bin/gpubroker
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpubroker"]
CMD ["serve"]
