package dev

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultPostgresImage is the image of PostgreSQL in a container when no
// installation is found: the official one, which a machine without a
// registry replaces with make demo-images' stand-in (POSTGRES_IMAGE).
const DefaultPostgresImage = "postgres:15.18-alpine"

// errNoPostgres is what dev says when it can run PostgreSQL neither
// locally nor in a container: what to install, in one line.
var errNoPostgres = errors.New("no PostgreSQL installation (initdb, postgres) and no Docker engine: " +
	"install PostgreSQL 15+ (apt-get install postgresql) or Docker, or set DATABASE_URL to a server")

// postgresContainer is PostgreSQL in a Docker container, for a machine
// with an engine and no PostgreSQL installation. Its data lives in the
// container and is removed with it.
type postgresContainer struct {
	id       string
	adminURL string
}

// startPostgresContainer runs image (pulled by the engine if it lacks it)
// with a fresh superuser password, publishes it on host:port (a free port
// for 0), and waits until it accepts connections over TCP, which the
// image's entrypoint allows only once its init scripts are done.
func startPostgresContainer(ctx context.Context, image, host string, port int, durable bool) (*postgresContainer, error) {
	if _, err := exec.LookPath("docker"); err != nil {
		return nil, errNoPostgres
	}
	if out, err := exec.CommandContext(ctx, "docker", "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w (docker: %s)", errNoPostgres, firstLine(out))
	}
	secret := make([]byte, 16)
	_, _ = rand.Read(secret) // never fails
	password := hex.EncodeToString(secret)
	publish := net.JoinHostPort(host, "") + ":5432"
	if port != 0 {
		publish = net.JoinHostPort(host, strconv.Itoa(port)) + ":5432"
	}
	args := []string{"run", "--detach", "--rm", "--label", "org.onceflow.dev=postgres", "--publish", publish,
		"--env", "POSTGRES_PASSWORD=" + password}
	if !durable {
		// As the local cluster's: a machine crash may lose a demo's data.
		args = append(args, "--env", "POSTGRES_INITDB_ARGS=--no-sync", image, "postgres", "-c", "fsync=off", "-c", "synchronous_commit=off")
	} else {
		args = append(args, image)
	}
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("postgres container of %s: %w: %s", image, err, strings.TrimSpace(string(out)))
	}
	c := &postgresContainer{id: lastLine(out)}
	if c.adminURL, err = c.url(ctx, password); err == nil {
		err = c.waitReady(ctx, 5*time.Minute) // initdb on a busy machine's overlay storage is slow
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("postgres container of %s: %w", image, err), c.stop(context.WithoutCancel(ctx)))
	}
	return c, nil
}

// url is the superuser's URL of the container's published port.
func (c *postgresContainer) url(ctx context.Context, password string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", "port", c.id, "5432/tcp").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("docker port: %w: %s", err, out)
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password), Host: firstLine(out), Path: "/postgres", RawQuery: "sslmode=disable"}
	return u.String(), nil
}

// waitReady pings the server until it answers or timeout passes.
func (c *postgresContainer) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := ping(ctx, c.adminURL)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %w", timeout, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// stop removes the container and its data.
func (c *postgresContainer) stop(ctx context.Context) error {
	if out, err := exec.CommandContext(ctx, "docker", "rm", "--force", "--volumes", c.id).CombinedOutput(); err != nil {
		return fmt.Errorf("remove postgres container %s: %w: %s", c.id, err, out)
	}
	return nil
}

// ping connects to url once, within 2 seconds.
func ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
