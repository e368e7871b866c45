// Package compose runs the compose demo for real, as a user does, on a
// Docker engine: `docker compose up --build` of the repository's
// docker-compose.yml, the README's calls from an HTTP client on the
// published ports, a service's container restarted and the NATS container
// killed while a few hundred orders are placed, `onceflow audit` inside the
// compose network, the observability profile (Prometheus scraping the four
// services, the saga's trace in Jaeger, Grafana's dashboard answering its
// queries through its data source proxy), and `docker compose down -v`,
// after which nothing of the project is left.
//
// Where no registry answers, the images are the stand-ins of
// deploy/standins/build.sh (make demo-images), which the test runs itself
// (cached: a second run builds nothing) unless COMPOSE_TEST_OFFICIAL_IMAGES
// is set, when the official images are pulled. It runs only with
// COMPOSE_DEMO_TEST=1 (make demo-test and .ci/run set it), not in go test
// ./...; without a Docker engine or `docker compose`, it is skipped with
// the reason.
package compose
