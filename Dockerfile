# syntax=docker/dockerfile:1
# One image for the four services (the command picks one: order, payment,
# inventory, notify) and the chores (migrate, outbox redrive, healthcheck).

FROM golang:1.26.8 AS build
WORKDIR /src
COPY . .
# Only the modules the binary imports are fetched (not the sqlc tool's), into
# cache mounts that outlive the build: a source change rebuilds in seconds.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/onceflow ./cmd/onceflow

# Static binary, no shell, no package manager; runs as uid 65532. The
# healthcheck is the binary itself: `onceflow healthcheck URL`.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/onceflow /onceflow
USER nonroot:nonroot
ENV HTTP_ADDR=0.0.0.0:8080 LOG_FORMAT=json
EXPOSE 8080
ENTRYPOINT ["/onceflow"]
CMD ["help"]
