package cli

import (
	"bytes"
	"cmp"
	"context"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caarlos0/env/v11"
	composecli "github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/localpg"
	"github.com/onceflow/onceflow/internal/postgres"
)

// The compose demo cannot be run here (no Docker engine), so these tests
// check what can be checked without one: the file as the compose spec's own
// loader reads it, and the files it mounts, run against real servers.

// repoRoot is where docker-compose.yml is.
const repoRoot = "../.."

// testOperatorSecret is the ISSUER_OPERATOR_SECRET the tests load the
// compose file with: it has no default.
const testOperatorSecret = "compose-test-secret"

// loadCompose loads docker-compose.yml as `docker compose` would, with an
// environment of ISSUER_OPERATOR_SECRET alone (required): every other
// ${VAR:-default} takes its default. The services of the profiles named
// are included.
func loadCompose(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	return loadComposeEnv(t, nil, profiles...)
}

// loadComposeEnv is loadCompose with the environment environ besides
// ISSUER_OPERATOR_SECRET.
func loadComposeEnv(t *testing.T, environ []string, profiles ...string) *types.Project {
	t.Helper()
	project, err := tryLoadCompose(t, append([]string{"ISSUER_OPERATOR_SECRET=" + testOperatorSecret}, environ...), profiles)
	require.NoError(t, err, "docker-compose.yml does not load")
	return project
}

// tryLoadCompose loads docker-compose.yml, and the override files, with
// exactly the environment environ.
func tryLoadCompose(t *testing.T, environ []string, profiles []string, overrides ...string) (*types.Project, error) {
	t.Helper()
	files := []string{filepath.Join(repoRoot, "docker-compose.yml")}
	for _, f := range overrides {
		files = append(files, filepath.Join(repoRoot, f))
	}
	opts, err := composecli.NewProjectOptions(files,
		composecli.WithWorkingDirectory(repoRoot),
		composecli.WithEnv(environ),
		composecli.WithProfiles(profiles),
	)
	require.NoError(t, err)
	return composecli.ProjectFromOptions(t.Context(), opts)
}

// The operator secret, which gets admin tokens (and so the console and
// every operator's API), has no working default: the file does not load
// without one, and the issuer and the seed job get the one given.
func TestComposeHasNoDefaultOperatorSecret(t *testing.T) {
	t.Parallel()
	for _, environ := range [][]string{{}, {"ISSUER_OPERATOR_SECRET="}} {
		_, err := tryLoadCompose(t, environ, nil)
		require.ErrorContains(t, err, "set ISSUER_OPERATOR_SECRET to a secret of your own", "%v", environ)
	}
	project := loadCompose(t)
	for _, name := range []string{"issuer", "seed"} {
		secret := project.Services[name].Environment["ISSUER_OPERATOR_SECRET"]
		require.NotNil(t, secret, name)
		require.Equal(t, testOperatorSecret, *secret, name)
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	require.NoError(t, err)
	require.NotContains(t, string(raw), "onceflow-demo", "the old default")
}

// `docker compose up -d --wait`, the form scripts and CI use, fails on a
// one-shot job that exited, even with 0 ("container onceflow-seed-1 exited
// (0)"), unless a service that stays up depends on the job's completion:
// every job (restart "no") is depended on so, with and without the
// observability profile. e2e/compose runs up --wait itself.
func TestComposeUpWaitAwaitsEveryJob(t *testing.T) {
	t.Parallel()
	for _, profiles := range [][]string{nil, {"observability"}} {
		project := loadCompose(t, profiles...)
		var jobs []string
		awaited := make(map[string]bool)
		for name, svc := range project.Services {
			if svc.Restart == types.RestartPolicyNo {
				jobs = append(jobs, name)
				continue
			}
			for dep, d := range svc.DependsOn {
				if d.Condition == types.ServiceConditionCompletedSuccessfully {
					awaited[dep] = true
				}
			}
		}
		require.Contains(t, jobs, "seed", "profiles %v", profiles)
		for _, job := range jobs {
			require.True(t, awaited[job], "profiles %v: no service that stays up depends on one-shot %s completing, so up --wait fails once it exits", profiles, job)
		}
	}
}

// onceflowServices are the compose services that run the onceflow image,
// with the service command each runs.
func onceflowServices(t *testing.T, project *types.Project) map[string]service {
	t.Helper()
	byName := make(map[string]service)
	for _, s := range services() {
		byName[s.name] = s
	}
	found := make(map[string]service)
	for name, svc := range project.Services {
		if svc.Build == nil || name == "console" { // the console is no service (TestComposeConsole)
			continue
		}
		require.Len(t, svc.Command, 1, "compose service %s: command", name)
		s, ok := byName[svc.Command[0]]
		require.True(t, ok, "compose service %s runs %q, which is no service command", name, svc.Command[0])
		found[name] = s
	}
	return found
}

func TestComposeRunsEveryService(t *testing.T) {
	t.Parallel()
	project := loadCompose(t)
	var commands []string
	for _, s := range onceflowServices(t, project) {
		commands = append(commands, s.name)
	}
	require.ElementsMatch(t, serviceNames(), commands)

	for name, svc := range project.Services {
		if svc.Build == nil {
			continue
		}
		dockerfile, err := os.ReadFile(filepath.Join(svc.Build.Context, cmp.Or(svc.Build.Dockerfile, "Dockerfile")))
		require.NoError(t, err, "compose service %s: Dockerfile", name)
		// The image's binary is where the commands and healthchecks call it.
		require.Contains(t, string(dockerfile), "go build -trimpath -ldflags=\"-s -w\" -o /out/onceflow ./cmd/onceflow")
		require.Contains(t, string(dockerfile), "COPY --from=build /out/onceflow /onceflow")
		require.Contains(t, string(dockerfile), `ENTRYPOINT ["/onceflow"]`)
		require.Equal(t, "/onceflow", svc.HealthCheck.Test[1], "compose service %s: healthcheck", name)
	}
}

func TestComposeEnvironmentIsReadByTheBinary(t *testing.T) {
	t.Parallel()
	project := loadCompose(t)
	for name, s := range onceflowServices(t, project) {
		svc := project.Services[name]
		read, err := s.envNames()
		require.NoError(t, err)
		require.Contains(t, read, "DATABASE_URL", "the env tags were not found")
		for key := range svc.Environment {
			require.Contains(t, read, key, "compose service %s sets %s, which `onceflow %s` does not read", name, key, s.name)
		}
		// Every required variable is set.
		for _, cfg := range []any{s.config, new(LogConfig)} {
			params, err := env.GetFieldParams(cfg)
			require.NoError(t, err)
			for _, p := range params {
				if p.Required {
					require.NotNil(t, svc.Environment[p.Key], "compose service %s lacks %s", name, p.Key)
				}
			}
		}
	}
}

func TestComposeServiceListensWhereItIsPublishedAndChecked(t *testing.T) {
	t.Parallel()
	project := loadCompose(t)
	for name := range onceflowServices(t, project) {
		svc := project.Services[name]
		addr := svc.Environment["HTTP_ADDR"]
		require.NotNil(t, addr, "compose service %s: HTTP_ADDR", name)
		host, port, err := net.SplitHostPort(*addr)
		require.NoError(t, err)
		require.Equal(t, "0.0.0.0", host, "compose service %s must listen beyond the container's loopback", name)

		require.Len(t, svc.Ports, 1, "compose service %s: ports", name)
		require.Equal(t, port, strconv.FormatUint(uint64(svc.Ports[0].Target), 10), "compose service %s publishes another port than it listens on", name)

		require.NotNil(t, svc.HealthCheck, "compose service %s: healthcheck", name)
		test := strings.Join(svc.HealthCheck.Test, " ")
		require.Contains(t, test, "/onceflow healthcheck http://127.0.0.1:"+port+"/", "compose service %s: healthcheck", name)
	}
}

func TestComposeDependenciesHaveHealthchecks(t *testing.T) {
	t.Parallel()
	project := loadCompose(t, observabilityProfile)
	dependedOn := 0
	for name, svc := range project.Services {
		for dep, cfg := range svc.DependsOn {
			dependedOn++
			target, ok := project.Services[dep]
			require.True(t, ok, "%s depends on unknown service %s", name, dep)
			if target.Restart == "no" {
				// A one-shot job (nats-auth, provision): done, not healthy.
				require.Equal(t, types.ServiceConditionCompletedSuccessfully, cfg.Condition, "%s depends on %s", name, dep)
				continue
			}
			require.Equal(t, types.ServiceConditionHealthy, cfg.Condition, "%s depends on %s", name, dep)
			require.NotNil(t, target.HealthCheck, "%s depends on %s, which has no healthcheck", name, dep)
			require.False(t, target.HealthCheck.Disable, "%s depends on %s, whose healthcheck is disabled", name, dep)
			require.NotEmpty(t, target.HealthCheck.Test, "%s depends on %s, whose healthcheck tests nothing", name, dep)
		}
	}
	require.Positive(t, dependedOn)
	require.Contains(t, project.Services["notify"].DependsOn, "mailpit")
}

func TestComposeHostPortsDoNotClash(t *testing.T) {
	t.Parallel()
	project := loadCompose(t, observabilityProfile)
	owner := make(map[string]string) // "tcp/8080" → service
	for name, svc := range project.Services {
		for _, p := range svc.Ports {
			require.NotEmpty(t, p.Published, "%s: port %d published on a random host port", name, p.Target)
			start, end, _ := strings.Cut(p.Published, "-")
			end = cmp.Or(end, start)
			require.Equal(t, start, end, "%s: port ranges are not checked", name)
			key := cmp.Or(p.Protocol, "tcp") + "/" + start
			prev, taken := owner[key]
			require.False(t, taken, "host port %s published by %s and %s", key, prev, name)
			owner[key] = name
		}
	}
	for _, want := range []string{"tcp/8080", "tcp/8081", "tcp/8082", "tcp/8083", "tcp/8025", "tcp/3000", "tcp/9090", "tcp/16686"} {
		require.Contains(t, owner, want)
	}
}

func TestComposeNATSConfig(t *testing.T) {
	t.Parallel()
	project := loadCompose(t)
	nats := project.Services["nats"]
	conf := mountedFile(t, nats, nats.Command[len(nats.Command)-1])
	require.Empty(t, nats.Ports, "NATS is published to nobody")

	// Beside a copy, what the nats-auth job writes into the volume the
	// server mounts beside its configuration.
	dir := t.TempDir()
	src, err := os.ReadFile(conf)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "onceflow.conf"), src, 0o644))
	require.True(t, mountedAt(nats, "/etc/nats/auth"), "the nats-auth volume is not mounted beside the configuration")
	var stdout, stderr bytes.Buffer
	require.NoError(t, Run(t.Context(), []string{"nats-auth", "--dir", filepath.Join(dir, "auth")}, &stdout, &stderr), stderr.String())
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "onceflow.conf"))
	require.NoError(t, err)
	require.Len(t, opts.TrustedOperators, 1, "operator mode: users are the JWTs the operator's account signs")
	for name := range onceflowServices(t, project) {
		creds := *project.Services[name].Environment["NATS_CREDS"]
		require.FileExists(t, filepath.Join(dir, "auth", strings.TrimPrefix(creds, "/auth/")), "%s: NATS_CREDS", name)
	}
	require.True(t, opts.JetStream, "JetStream enabled")
	require.True(t, opts.SyncAlways, "sync_interval: always")
	require.NotEmpty(t, opts.StoreDir)
	require.True(t, mountedAt(nats, opts.StoreDir), "the JetStream store %s is on no volume", opts.StoreDir)
	require.Equal(t, 8222, opts.HTTPPort, "monitoring, for the healthcheck")
	require.Contains(t, strings.Join(nats.HealthCheck.Test, " "), "http://127.0.0.1:8222/healthz")

	for name := range onceflowServices(t, project) {
		u, err := url.Parse(*project.Services[name].Environment["NATS_URL"])
		require.NoError(t, err)
		require.Equal(t, net.JoinHostPort("nats", strconv.Itoa(opts.Port)), u.Host, "%s: NATS_URL", name)
	}
}

// TestComposePostgresInitScript runs the init script the compose file mounts
// against a cluster of its own (its roles are global to a cluster), then
// connects as each service does in the compose file: each role migrates its
// own database and can connect to no other.
func TestComposePostgresInitScript(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	project := loadCompose(t)
	pg := project.Services["postgres"]
	script := ""
	for _, v := range pg.Volumes {
		if strings.HasPrefix(v.Target, "/docker-entrypoint-initdb.d/") {
			script = v.Source
		}
	}
	require.NotEmpty(t, script, "no init script mounted into /docker-entrypoint-initdb.d")

	cluster, err := localpg.Start(ctx, localpg.Config{}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cluster.Stop(context.Background())) })
	admin, err := url.Parse(cluster.URL("postgres"))
	require.NoError(t, err)

	cmd := exec.CommandContext(ctx, "sh", script)
	cmd.Env = append(os.Environ(), "PGHOST="+admin.Hostname(), "PGPORT="+admin.Port(), "PATH="+psqlDir(t)+":"+os.Getenv("PATH"))
	for k, v := range pg.Environment {
		if v != nil {
			cmd.Env = append(cmd.Env, k+"="+*v)
		}
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "init script: %s", out)

	// The compose URLs, pointed at the test cluster.
	urls := make(map[string]*url.URL)
	for name, s := range onceflowServices(t, project) {
		u, err := url.Parse(*project.Services[name].Environment["DATABASE_URL"])
		require.NoError(t, err)
		require.Equal(t, "postgres:5432", u.Host, "%s: DATABASE_URL", name)
		u.Host = admin.Host
		urls[s.name] = u
	}
	for name, u := range urls {
		pool, err := postgres.Connect(ctx, u.String())
		require.NoError(t, err, "%s connects to its own database", name)
		schema, err := postgres.ServiceSchema(name)
		require.NoError(t, err)
		err = postgres.Migrate(ctx, pool, schema, slog.New(slog.DiscardHandler))
		pool.Close()
		require.NoError(t, err, "%s migrates its own database", name)

		others := []string{"postgres", "template1"}
		for other, v := range urls {
			if other != name {
				others = append(others, strings.TrimPrefix(v.Path, "/"))
			}
		}
		for _, db := range others {
			v := *u
			v.Path = "/" + db
			conn, err := pgx.Connect(ctx, v.String())
			if err == nil {
				_ = conn.Close(ctx)
			}
			require.ErrorContains(t, err, "permission denied", "%s connects to %s", name, db)
		}
	}
}

// psqlDir is the directory of psql: on PATH, else the newest installed.
func psqlDir(t *testing.T) string {
	t.Helper()
	if path, err := exec.LookPath("psql"); err == nil {
		return filepath.Dir(path)
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	require.NotEmpty(t, matches, "psql is not installed")
	slices.Sort(matches)
	return filepath.Dir(matches[len(matches)-1])
}

// mountedFile returns the host file that svc mounts at target.
func mountedFile(t *testing.T, svc types.ServiceConfig, target string) string {
	t.Helper()
	for _, v := range svc.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == target {
			return v.Source
		}
	}
	t.Fatalf("compose service %s mounts nothing at %s", svc.Name, target)
	return ""
}

// mountedAt reports whether path lies on a volume of svc.
func mountedAt(svc types.ServiceConfig, path string) bool {
	for _, v := range svc.Volumes {
		if path == v.Target || strings.HasPrefix(path, strings.TrimSuffix(v.Target, "/")+"/") {
			return true
		}
	}
	return false
}

// The console reads what compose sets, listens where it is published and
// checked, and reads every service's database.
func TestComposeConsole(t *testing.T) {
	t.Parallel()
	project := loadCompose(t)
	svc, ok := project.Services["console"]
	require.True(t, ok)
	require.Equal(t, []string{"console"}, []string(svc.Command))
	read := []string{"NATS_URL", "NATS_CREDS", "LOG_FORMAT"}
	for _, cfg := range []any{new(consoleEnv), new(LogConfig)} {
		params, err := env.GetFieldParams(cfg)
		require.NoError(t, err)
		for _, p := range params {
			read = append(read, p.Key)
		}
	}
	for _, name := range serviceNames() {
		read = append(read, strings.ToUpper(name)+"_DATABASE_URL")
		require.NotNil(t, svc.Environment[strings.ToUpper(name)+"_DATABASE_URL"], name)
	}
	for key := range svc.Environment {
		require.Contains(t, read, key, "compose sets %s, which `onceflow console` does not read", key)
	}
	_, port, err := net.SplitHostPort(*svc.Environment["CONSOLE_ADDR"])
	require.NoError(t, err)
	require.Len(t, svc.Ports, 1)
	require.Equal(t, port, strconv.FormatUint(uint64(svc.Ports[0].Target), 10))
	require.Contains(t, strings.Join(svc.HealthCheck.Test, " "), "/onceflow healthcheck http://127.0.0.1:"+port+"/healthz")
}

// A pulled image is pinned to a release (a tag with its full version,
// major.minor.patch, PostgreSQL's being major.minor, or a digest): no tag,
// `latest` or a moving tag like 15-alpine or 2.12 changes under the demo.
// The images are those of an empty environment, the defaults of the
// variables that select stand-ins. The onceflow image is the one compose
// builds.
func TestComposeImagesArePinned(t *testing.T) {
	t.Parallel()
	pinned := regexp.MustCompile(`^[^:@]+:v?[0-9]+\.[0-9]+\.[0-9]+(-[a-z0-9.]+)?$|^postgres:[0-9]+\.[0-9]+(-[a-z0-9.]+)?$|@sha256:[0-9a-f]{64}$`)
	project := loadCompose(t, observabilityProfile)
	for name, svc := range project.Services {
		require.NotEmpty(t, svc.Image, "%s names no image", name)
		if strings.HasPrefix(svc.Image, "onceflow:") {
			continue
		}
		require.Regexp(t, pinned, svc.Image, "%s's image is not pinned to a version", name)
	}
	// And so is every image the onceflow image is built from, by default.
	from := dockerfileFrom(t)
	require.NotEmpty(t, from)
	for _, image := range from {
		if image != "scratch" {
			require.Regexp(t, pinned, image, "the Dockerfile's FROM %s is not pinned to a version", image)
		}
	}
}

// dockerfileFrom is the images the Dockerfile's stages start from, with
// each ${ARG} replaced by its default.
func dockerfileFrom(t *testing.T) []string {
	t.Helper()
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	args := make(map[string]string)
	for _, m := range regexp.MustCompile(`(?m)^ARG\s+(\w+)=(\S+)`).FindAllStringSubmatch(string(dockerfile), -1) {
		args[m[1]] = m[2]
	}
	var images []string
	for _, m := range regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(string(dockerfile), -1) {
		image := os.Expand(m[1], func(name string) string {
			v, ok := args[name]
			require.True(t, ok, "the Dockerfile's FROM %s uses an ARG with no default", m[1])
			return v
		})
		images = append(images, image)
	}
	return images
}

// Every third-party image, and the Dockerfile's build image, is chosen by
// a variable (make demo-images prints the exports of the stand-ins).
func TestComposeImagesAreChosenByVariables(t *testing.T) {
	t.Parallel()
	variables := map[string]string{ // service → variable
		"postgres": "POSTGRES_IMAGE", "nats": "NATS_IMAGE", "mailpit": "MAILPIT_IMAGE",
		"prometheus": "PROMETHEUS_IMAGE", "grafana": "GRAFANA_IMAGE", "jaeger": "JAEGER_IMAGE",
	}
	var environ []string
	for _, v := range variables {
		environ = append(environ, v+"=standin/"+strings.ToLower(v)+":1")
	}
	project := loadComposeEnv(t, append(environ, "GO_IMAGE=standin/go:1"), observabilityProfile)
	for name, svc := range project.Services {
		if strings.HasPrefix(svc.Image, "onceflow:") {
			if svc.Build != nil {
				require.Equal(t, "standin/go:1", *svc.Build.Args["GO_IMAGE"], "%s: the build's GO_IMAGE", name)
			}
			continue
		}
		v, ok := variables[name]
		require.True(t, ok, "%s's image %s is chosen by no variable", name, svc.Image)
		require.Equal(t, "standin/"+strings.ToLower(v)+":1", svc.Image, name)
	}
	require.Contains(t, dockerfileFrom(t), "golang:1.26.8")
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	require.Contains(t, string(dockerfile), "FROM ${GO_IMAGE} AS build")
	// The classic builder (no buildx plugin) must be able to build it.
	require.NotRegexp(t, `(?m)^RUN\s+--mount`, string(dockerfile), "RUN --mount needs BuildKit")
	require.NotRegexp(t, `(?m)^#\s*syntax=`, string(dockerfile), "a syntax line makes BuildKit pull its frontend")
}

// PostgreSQL, whose superuser has the demo's password, is published to
// nobody unless the override file is added, and then on the loopback only.
func TestComposePostgresIsNotPublished(t *testing.T) {
	t.Parallel()
	project := loadCompose(t, observabilityProfile)
	require.Empty(t, project.Services["postgres"].Ports)

	withOverride, err := tryLoadCompose(t, []string{"ISSUER_OPERATOR_SECRET=" + testOperatorSecret}, nil, "deploy/compose/publish-postgres.yml")
	require.NoError(t, err)
	ports := withOverride.Services["postgres"].Ports
	require.Len(t, ports, 1)
	require.Equal(t, "127.0.0.1", ports[0].HostIP)
	require.Equal(t, "5432", ports[0].Published)
}

// The Dockerfile copies the binary's sources only: every package of the
// module that ./cmd/onceflow imports lies in a directory it copies.
func TestDockerfileCopiesTheBinarysSources(t *testing.T) {
	t.Parallel()
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	copied := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^COPY\s+([^-].*)$`).FindAllStringSubmatch(string(dockerfile), -1) {
		fields := strings.Fields(m[1])
		for _, src := range fields[:len(fields)-1] { // the last is the destination
			copied[src] = true
		}
	}
	require.True(t, copied["go.mod"] && copied["go.sum"], "the Dockerfile copies %v", copied)

	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.ImportPath}}{{end}}{{end}}", "./cmd/onceflow")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	require.NoError(t, err)
	for _, pkg := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(pkg, "github.com/onceflow/onceflow/")
		top, _, _ := strings.Cut(rel, "/")
		require.True(t, copied[top], "the binary imports %s, whose directory %s the Dockerfile does not copy", pkg, top)
	}
}
