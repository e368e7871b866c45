package compose

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// repoRoot is where docker-compose.yml is.
const repoRoot = "../.."

// project is the compose project the test runs, on the demo's host ports:
// another running demo on this machine makes the test fail, not share it.
type project struct {
	name    string
	environ []string // the stand-ins' exports and the variables compose reads
}

// dockerMissing says why the test cannot run here, or "".
func dockerMissing(ctx context.Context) string {
	if _, err := exec.LookPath("docker"); err != nil {
		return "no docker CLI on PATH"
	}
	if out, err := exec.CommandContext(ctx, "docker", "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		return "no Docker engine answers: " + firstLine(out)
	}
	return ""
}

// standIns runs deploy/standins/build.sh (which builds Compose v2 too
// where `docker compose` is missing) and returns its exports.
func standIns(t *testing.T) []string {
	t.Helper()
	if os.Getenv("COMPOSE_TEST_OFFICIAL_IMAGES") != "" {
		t.Log("images: the official ones (COMPOSE_TEST_OFFICIAL_IMAGES is set)")
		return nil
	}
	start := time.Now()
	cmd := exec.CommandContext(t.Context(), "bash", filepath.Join(repoRoot, "deploy/standins/build.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "deploy/standins/build.sh: %s", stderr.String())
	var environ []string
	scanner := bufio.NewScanner(bytes.NewReader(out))
	for scanner.Scan() {
		if kv, ok := strings.CutPrefix(scanner.Text(), "export "); ok {
			environ = append(environ, kv)
		}
	}
	require.NotEmpty(t, environ, "deploy/standins/build.sh printed no exports")
	t.Logf("images: the stand-ins (%s in %s): %s", "deploy/standins/build.sh", time.Since(start).Round(time.Second), strings.Join(environ, " "))
	return environ
}

// compose runs `docker compose` on the project and returns its output,
// failing the test on an error.
func (p *project) compose(t *testing.T, args ...string) string {
	t.Helper()
	out, err := p.run(t.Context(), args...)
	require.NoError(t, err, "docker compose %s: %s", strings.Join(args, " "), out)
	return out
}

// run runs `docker compose` on the project.
func (p *project) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", append([]string{"compose", "-p", p.name, "-f", filepath.Join(repoRoot, "docker-compose.yml")}, args...)...)
	cmd.Env = append(os.Environ(), p.environ...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// containerState is a container of `docker compose ps --format json`.
type containerState struct {
	Service  string `json:"Service"`
	State    string `json:"State"`
	Health   string `json:"Health"`
	ExitCode int    `json:"ExitCode"`
}

// states returns the project's containers by service, the stopped ones
// included.
func (p *project) states(ctx context.Context) (map[string]containerState, error) {
	out, err := p.run(ctx, "ps", "--all", "--format", "json")
	if err != nil {
		return nil, fmt.Errorf("docker compose ps: %w: %s", err, out)
	}
	states := make(map[string]containerState)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" || !strings.HasPrefix(line, "{") {
			continue
		}
		var s containerState
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			return nil, fmt.Errorf("docker compose ps: %w: %s", err, line)
		}
		states[s.Service] = s
	}
	return states, nil
}

// awaitHealthy waits until every long-running service of want is healthy
// (running, for one without a healthcheck) and every one-shot job of jobs
// has exited 0; a job that failed fails the test at once.
func (p *project) awaitHealthy(t *testing.T, timeout time.Duration, want, jobs []string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last map[string]containerState
	for time.Now().Before(deadline) {
		states, err := p.states(t.Context())
		require.NoError(t, err)
		last = states
		ready := true
		for _, job := range jobs {
			s, ok := states[job]
			if ok && s.State == "exited" {
				require.Zero(t, s.ExitCode, "job %s failed:\n%s", job, p.logs(t, job))
			}
			ready = ready && ok && s.State == "exited"
		}
		for _, svc := range want {
			s := states[svc]
			ready = ready && s.State == "running" && (s.Health == "" || s.Health == "healthy")
		}
		if ready {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("not healthy after %s: %+v\n%s", timeout, last, p.logs(t))
}

// logs is the last lines of the named services' logs (all by default).
func (p *project) logs(t *testing.T, services ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, _ := p.run(ctx, append([]string{"logs", "--no-color", "--tail", "40"}, services...)...)
	return out
}

// leftovers lists what of the project is left on the engine: containers,
// volumes and networks labelled with its name.
func (p *project) leftovers(ctx context.Context) (string, error) {
	var left []string
	for _, kind := range [][]string{
		{"ps", "-a", "--format", "container {{.Names}}"},
		{"volume", "ls", "--format", "volume {{.Name}}"},
		{"network", "ls", "--format", "network {{.Name}}"},
	} {
		args := append([]string{kind[0]}, kind[1:len(kind)-2]...)
		args = append(args, "--filter", "label=com.docker.compose.project="+p.name, kind[len(kind)-2], kind[len(kind)-1])
		out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, out)
		}
		if s := strings.TrimSpace(string(out)); s != "" {
			left = append(left, s)
		}
	}
	return strings.Join(left, "\n"), nil
}

// down removes the project with its volumes and checks that nothing of it
// is left.
func (p *project) down(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := p.run(ctx, "--profile", "observability", "down", "-v", "--remove-orphans", "--timeout", "20")
	require.NoError(t, err, "docker compose down -v: %s", out)
	left, err := p.leftovers(ctx)
	require.NoError(t, err)
	require.Empty(t, left, "docker compose down -v left these behind")
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}
