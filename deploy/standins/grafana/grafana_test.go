package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The compose file mounts the demo's provisioning and dashboards here.
const (
	demoProvisioning = "../../grafana/provisioning"
	demoDashboards   = "../../grafana/dashboards"
	mountedAt        = "/var/lib/grafana/dashboards"
)

// serveDemo serves the demo's provisioning files, the dashboards path
// pointed at the repository's directory, plus a data source "upstream" on
// ${UPSTREAM_URL}/prefix; it returns the server's URL.
func serveDemo(t *testing.T, upstreamURL string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "datasources"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "dashboards"), 0o755))
	ds, err := os.ReadFile(filepath.Join(demoProvisioning, "datasources/onceflow.yml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "datasources/onceflow.yml"), ds, 0o644))
	upstream := "apiVersion: 1\ndatasources:\n  - name: Upstream\n    uid: upstream\n    type: prometheus\n    url: ${UPSTREAM_URL}/prefix\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "datasources/upstream.yaml"), []byte(upstream), 0o644))
	providers, err := os.ReadFile(filepath.Join(demoProvisioning, "dashboards/onceflow.yml"))
	require.NoError(t, err)
	require.Contains(t, string(providers), mountedAt, "the provider reads where docker-compose.yml mounts the dashboards")
	abs, err := filepath.Abs(demoDashboards)
	require.NoError(t, err)
	providers = []byte(strings.ReplaceAll(string(providers), mountedAt, abs))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "dashboards/onceflow.yml"), providers, 0o644))

	getenv := func(name string) string {
		if name == "UPSTREAM_URL" {
			return upstreamURL
		}
		return ""
	}
	prov, err := loadProvisioning(dir, getenv)
	require.NoError(t, err)
	srv := httptest.NewServer(newServer(prov, mountedAt+"/onceflow.json", slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	return srv.URL
}

func get(t *testing.T, u string, out any) int {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	if out != nil && resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	}
	return resp.StatusCode
}

func TestServesTheDemosDashboard(t *testing.T) {
	t.Parallel()
	base := serveDemo(t, "http://127.0.0.1:1")

	var health map[string]string
	require.Equal(t, http.StatusOK, get(t, base+"/api/health", &health))
	require.Equal(t, "ok", health["database"])

	var hits []struct {
		UID, Title, Type, FolderTitle string
		Tags                          []string
	}
	require.Equal(t, http.StatusOK, get(t, base+"/api/search?query=ONCE&tag=onceflow", &hits))
	require.Len(t, hits, 1)
	require.Equal(t, "onceflow", hits[0].UID)
	require.Equal(t, "dash-db", hits[0].Type)
	require.Equal(t, "onceflow", hits[0].FolderTitle)
	require.Equal(t, http.StatusOK, get(t, base+"/api/search?query=nothing-like-it", &hits))
	require.Empty(t, hits)

	var board struct {
		Dashboard struct {
			UID    string
			Panels []struct {
				Targets []struct{ Expr string }
			}
		}
		Meta struct{ Provisioned bool }
	}
	require.Equal(t, http.StatusOK, get(t, base+"/api/dashboards/uid/onceflow", &board))
	require.Equal(t, "onceflow", board.Dashboard.UID)
	require.True(t, board.Meta.Provisioned)
	exprs := 0
	for _, p := range board.Dashboard.Panels {
		exprs += len(p.Targets)
	}
	require.Greater(t, exprs, 10, "the panels' queries come with the dashboard")
	require.Equal(t, http.StatusNotFound, get(t, base+"/api/dashboards/uid/nope", nil))

	board.Dashboard.UID = ""
	require.Equal(t, http.StatusOK, get(t, base+"/api/dashboards/home", &board))
	require.Equal(t, "onceflow", board.Dashboard.UID, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
}

func TestServesTheDemosDatasources(t *testing.T) {
	t.Parallel()
	base := serveDemo(t, "http://127.0.0.1:1")
	var ds datasource
	require.Equal(t, http.StatusOK, get(t, base+"/api/datasources/uid/prometheus", &ds))
	require.Equal(t, "http://prometheus:9090", ds.URL)
	require.Equal(t, "prometheus", ds.Type)
	require.True(t, ds.IsDefault)
	var all []datasource
	require.Equal(t, http.StatusOK, get(t, base+"/api/datasources", &all))
	require.Len(t, all, 3) // Prometheus, Jaeger, Upstream
	require.Equal(t, http.StatusNotFound, get(t, base+"/api/datasources/uid/nope", nil))
}

// TestProxiesQueriesToTheDatasource: a panel's query reaches the data
// source's URL, path and query string as sent, without the caller's
// cookies, and its answer comes back as it was.
func TestProxiesQueriesToTheDatasource(t *testing.T) {
	t.Parallel()
	seen := make(chan *http.Request, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, `{"status":"success"}`)
	}))
	t.Cleanup(upstream.Close)
	base := serveDemo(t, upstream.URL)

	req, err := http.NewRequest(http.MethodGet, base+"/api/datasources/proxy/uid/upstream/api/v1/query?query=sum(rate(x%5B1m%5D))", nil)
	require.NoError(t, err)
	req.Header.Set("Cookie", "grafana_session=secret")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusTeapot, resp.StatusCode)
	require.JSONEq(t, `{"status":"success"}`, string(body))

	r := <-seen
	require.Equal(t, "/prefix/api/v1/query", r.URL.Path)
	require.Equal(t, "sum(rate(x[1m]))", r.URL.Query().Get("query"))
	require.Empty(t, r.Header.Get("Cookie"))

	require.Equal(t, http.StatusNotFound, get(t, base+"/api/datasources/proxy/uid/nope/api/v1/query", nil))
}

// TestUnreachableDatasource is a 502, not a hang or a crash.
func TestUnreachableDatasource(t *testing.T) {
	t.Parallel()
	base := serveDemo(t, "http://127.0.0.1:1")
	require.Equal(t, http.StatusBadGateway, get(t, base+"/api/datasources/proxy/uid/upstream/api/v1/query?query=up", nil))
}
