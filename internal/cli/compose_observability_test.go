package cli

import (
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// observabilityProfile is the compose profile of Prometheus, Grafana and
// Jaeger.
const observabilityProfile = "observability"

var observabilityServices = []string{"prometheus", "grafana", "jaeger"}

func TestComposeObservabilityIsOptional(t *testing.T) {
	t.Parallel()
	project := loadCompose(t)
	for _, name := range observabilityServices {
		require.NotContains(t, project.Services, name, "%s runs without the %s profile", name, observabilityProfile)
	}
	for name := range onceflowServices(t, project) {
		endpoint := project.Services[name].Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]
		require.True(t, endpoint == nil || *endpoint == "", "%s exports traces by default", name)
	}
}

// TestComposePrometheusScrapesEveryService reads the scrape config that
// Prometheus mounts: each onceflow service is a target where it listens.
func TestComposePrometheusScrapesEveryService(t *testing.T) {
	t.Parallel()
	project := loadCompose(t, observabilityProfile)
	prom := project.Services["prometheus"]
	require.Equal(t, []string{observabilityProfile}, prom.Profiles)
	var cfg struct {
		ScrapeConfigs []struct {
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, mountedFile(t, prom, "/etc/prometheus/prometheus.yml"), &cfg)

	targets := map[string]string{} // target → service label
	for _, sc := range cfg.ScrapeConfigs {
		require.Equal(t, "/metrics", sc.MetricsPath)
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				targets[target] = st.Labels["service"]
			}
		}
	}
	for name, s := range onceflowServices(t, project) {
		_, port, err := net.SplitHostPort(*project.Services[name].Environment["HTTP_ADDR"])
		require.NoError(t, err)
		target := net.JoinHostPort(name, port)
		require.Contains(t, targets, target, "Prometheus does not scrape %s", name)
		require.Equal(t, s.name, targets[target], "the service label of %s", target)
	}
}

// TestComposePrometheusLoadsTheAlerts: each rule file prometheus.yml names
// is mounted where it says, and it is deploy/prometheus/alerts.yml, the
// file internal/app checks against the metrics the services export.
func TestComposePrometheusLoadsTheAlerts(t *testing.T) {
	t.Parallel()
	prom := loadCompose(t, observabilityProfile).Services["prometheus"]
	var cfg struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	readYAML(t, mountedFile(t, prom, "/etc/prometheus/prometheus.yml"), &cfg)
	require.Equal(t, []string{"/etc/prometheus/alerts.yml"}, cfg.RuleFiles)
	want, err := filepath.Abs(filepath.Join(repoRoot, "deploy", "prometheus", "alerts.yml"))
	require.NoError(t, err)
	require.Equal(t, want, mountedFile(t, prom, cfg.RuleFiles[0]))
}

// TestComposeGrafanaProvisioning reads what Grafana mounts: its data sources
// are the profile's Prometheus and Jaeger, and the onceflow dashboard loads
// from where the provider looks and queries the provisioned Prometheus.
func TestComposeGrafanaProvisioning(t *testing.T) {
	t.Parallel()
	project := loadCompose(t, observabilityProfile)
	grafana := project.Services["grafana"]
	provisioning := mountedFile(t, grafana, "/etc/grafana/provisioning")

	var ds struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, filepath.Join(provisioning, "datasources", "onceflow.yml"), &ds)
	uids := map[string]string{}
	for _, d := range ds.Datasources {
		u, err := url.Parse(d.URL)
		require.NoError(t, err)
		target, ok := project.Services[u.Hostname()]
		require.True(t, ok, "data source %s points at %s, which is no service", d.UID, d.URL)
		require.True(t, listensOn(target, u.Port()), "%s does not listen on %s", u.Hostname(), u.Port())
		uids[d.Type] = d.UID
	}
	require.Contains(t, uids, "prometheus")
	require.Contains(t, uids, "jaeger")

	var providers struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(provisioning, "dashboards", "onceflow.yml"), &providers)
	require.Len(t, providers.Providers, 1)
	dir := mountedFile(t, grafana, providers.Providers[0].Options.Path)

	b, err := os.ReadFile(filepath.Join(dir, "onceflow.json"))
	require.NoError(t, err)
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	require.Equal(t, "onceflow", dash.UID)
	graphs := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		graphs++
		require.Equal(t, uids["prometheus"], p.Datasource.UID, "panel %q", p.Title)
		require.NotEmpty(t, p.Targets, "panel %q", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
		}
	}
	require.GreaterOrEqual(t, graphs, 10)
}

// TestComposeTracesGoToJaeger sets OTEL_EXPORTER_OTLP_ENDPOINT as the
// README says: every onceflow service exports to Jaeger's OTLP port.
func TestComposeTracesGoToJaeger(t *testing.T) {
	t.Parallel()
	project := loadComposeEnv(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318"}, observabilityProfile)
	jaeger := project.Services["jaeger"]
	require.True(t, listensOn(jaeger, "4318"), "Jaeger publishes no OTLP/HTTP port")
	for name := range onceflowServices(t, project) {
		endpoint := project.Services[name].Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]
		require.NotNil(t, endpoint, name)
		require.Equal(t, "http://jaeger:4318", *endpoint, name)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, v), path)
}

// listensOn reports whether svc publishes or exposes the container port.
func listensOn(svc types.ServiceConfig, port string) bool {
	for _, p := range svc.Ports {
		if strconv.FormatUint(uint64(p.Target), 10) == port {
			return true
		}
	}
	for _, p := range svc.Expose {
		if p == port {
			return true
		}
	}
	return false
}
