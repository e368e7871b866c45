package testenv

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
)

// The images the container path runs. Like the compose file, each is
// chosen by a variable whose default is the official image; make
// demo-images builds offline stand-ins and prints the exports that select
// them.
const (
	defaultPostgresImage = "postgres:15.18-alpine"
	defaultNATSImage     = "nats:2.15.2-alpine"
)

// PostgresImage is the PostgreSQL image of the container path:
// POSTGRES_IMAGE, else the official one.
func PostgresImage() string { return imageFromEnv("POSTGRES_IMAGE", defaultPostgresImage) }

// NATSImage is the NATS image of the container path: NATS_IMAGE, else the
// official one.
func NATSImage() string { return imageFromEnv("NATS_IMAGE", defaultNATSImage) }

func imageFromEnv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// ContainerChoice is whether the tests run their servers in containers, and
// why, for the test log.
type ContainerChoice struct {
	Use    bool
	Reason string
}

// ChooseContainers decides whether servers run as containers of images.
// TEST_CONTAINERS selects: "on" (or 1, true) requires them and fails the
// tests if the engine does not answer; "off" (or 0, false) never uses them;
// unset or "auto" uses them only when an engine answers and every image is
// already present on it, since pulling is what fails on a machine with no
// registry. The error is for "on" without an engine or with a bad value.
func ChooseContainers(ctx context.Context, images ...string) (ContainerChoice, error) {
	mode := strings.ToLower(strings.TrimSpace(os.Getenv("TEST_CONTAINERS")))
	switch mode {
	case "off", "0", "false", "no":
		return ContainerChoice{Reason: "TEST_CONTAINERS=" + mode}, nil
	case "on", "1", "true", "yes":
		if err := dockerHealth(ctx); err != nil {
			return ContainerChoice{}, fmt.Errorf("TEST_CONTAINERS=%s but no Docker engine answers: %w", mode, err)
		}
		return ContainerChoice{Use: true, Reason: "TEST_CONTAINERS=" + mode}, nil
	case "", "auto":
	default:
		return ContainerChoice{}, fmt.Errorf("TEST_CONTAINERS=%q: want on, off or auto", mode)
	}
	if err := dockerHealth(ctx); err != nil {
		return ContainerChoice{Reason: fmt.Sprintf("no Docker engine answers (%v)", err)}, nil
	}
	if missing := absentImages(ctx, images); len(missing) > 0 {
		return ContainerChoice{Reason: fmt.Sprintf("a Docker engine answers but these images are not present locally: %s "+
			"(TEST_CONTAINERS=on pulls them; make demo-images builds offline stand-ins)", strings.Join(missing, ", "))}, nil
	}
	return ContainerChoice{Use: true, Reason: "a Docker engine answers and holds " + strings.Join(images, ", ")}, nil
}

// dockerHealth is nil when a Docker engine answers.
func dockerHealth(ctx context.Context) (err error) {
	// Some testcontainers paths panic when no engine is configured.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("docker provider: %v", r)
		}
	}()
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return provider.Health(ctx) // also closes the provider
}

// absentImages lists the images the engine does not hold, asking it
// through one client without pulling any; all of them when it cannot ask.
func absentImages(ctx context.Context, images []string) (missing []string) {
	defer func() {
		if recover() != nil {
			missing = images
		}
	}()
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return images
	}
	defer provider.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, image := range images {
		if _, err := provider.Client().ImageInspect(ctx, image); err != nil {
			missing = append(missing, image)
		}
	}
	return missing
}

// OnLoopback publishes a container's ports (e.g. "5432/tcp") on 127.0.0.1
// only, each on a free port. Docker Engine 20.10 may publish a port on
// different host ports for IPv4 and IPv6, and testcontainers then dials
// 127.0.0.1 on the IPv6 one; bound to one address, a port has one host
// port, and no other host reaches the test's servers.
func OnLoopback(ports ...string) testcontainers.CustomizeRequestOption {
	return testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
		if hc.PortBindings == nil {
			hc.PortBindings = network.PortMap{}
		}
		for _, p := range ports {
			hc.PortBindings[network.MustParsePort(p)] = []network.PortBinding{{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: "0"}}
		}
	})
}
