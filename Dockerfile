# One image for the four services (the command picks one: order, payment,
# inventory, notify) and the chores (migrate, outbox redrive, healthcheck).
#
# No syntax directive and no cache mounts on RUN: both need BuildKit (the first
# pulls a frontend image), and the classic builder, which is all a Docker
# CLI without the buildx plugin has, must build this file too.

# The build stage's image: the official golang image by default; GO_IMAGE
# names another (make demo-images builds an offline stand-in).
ARG GO_IMAGE=golang:1.26.8

FROM ${GO_IMAGE} AS build
WORKDIR /src
# The binary's sources only (go list -deps ./cmd/onceflow): an edit of the
# docs, the tests outside them or the compose file rebuilds nothing.
COPY go.mod go.sum ./
COPY cmd ./cmd
COPY db ./db
COPY internal ./internal
COPY services ./services
# Only the modules the binary imports are fetched (not the sqlc tool's).
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/onceflow ./cmd/onceflow
# The image user's home: compose mounts the nats-auth volume there, and a
# new volume takes the owner of the directory it is mounted on.
RUN mkdir -p /out/home/nonroot

# Static binary, no shell, no package manager; runs as uid 65532. The
# healthcheck is the binary itself: `onceflow healthcheck URL`. From scratch
# rather than a distroless image, whose tags move: nothing here changes
# unless golang's pinned tag does. The CA roots are the build image's, for
# an identity provider's JWKS over https.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/
COPY --from=build /out/onceflow /onceflow
COPY --from=build --chown=65532:65532 /out/home/nonroot /home/nonroot
USER 65532:65532
ENV HTTP_ADDR=0.0.0.0:8080 LOG_FORMAT=json
EXPOSE 8080
ENTRYPOINT ["/onceflow"]
CMD ["help"]
