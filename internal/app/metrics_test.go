package app

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/deploy/grafana"
	promdeploy "github.com/onceflow/onceflow/deploy/prometheus"
	"github.com/onceflow/onceflow/internal/httpapi"
)

// recorder is a Registerer that keeps what is registered.
type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}
func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}
func (r *recorder) Unregister(prometheus.Collector) bool { return false }

var fqName = regexp.MustCompile(`fqName: "([a-z_]+)"`)

// metricNames are the names of every onceflow metric a service exports.
func metricNames(t *testing.T) []string {
	t.Helper()
	rec := &recorder{}
	_, err := newMetrics(rec)
	require.NoError(t, err)
	_, err = httpapi.Observe(rec, noop.NewTracerProvider())
	require.NoError(t, err)
	_, err = newPartitionObserver(rec)
	require.NoError(t, err)
	rec.collectors = append(rec.collectors, newStatsCollector(nil), newPoolCollector(nil, "http"))

	var names []string
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			require.NotNil(t, m, d.String())
			names = append(names, m[1])
		}
	}
	return names
}

// exportedName is the metric of names that the series m is of: a
// histogram's series are its name with _bucket, _sum or _count.
func exportedName(names []string, m string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(m, suffix); ok && slices.Contains(names, base) {
			return base
		}
	}
	return m
}

// serviceMetricPrefixes name the metrics a service exports beyond the
// shared runtime's; the service's own test checks them against the
// dashboard (apptest.RequireDashboardShows).
var serviceMetricPrefixes = []string{"onceflow_order_", "onceflow_mailer_"}

// TestDashboardQueriesExportedMetrics reads the Grafana dashboard of the
// compose demo: every onceflow metric it queries is exported, and every
// exported metric is on it.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	t.Parallel()
	names := metricNames(t)
	queried, err := grafana.QueriedMetrics(regexp.MustCompile(`onceflow_[a-z_]+`))
	require.NoError(t, err)

	used := map[string]bool{}
	for _, m := range queried {
		if slices.ContainsFunc(serviceMetricPrefixes, func(p string) bool { return strings.HasPrefix(m, p) }) {
			continue
		}
		m = exportedName(names, m)
		require.Contains(t, names, m, "the dashboard queries a metric nobody exports")
		used[m] = true
	}
	for _, n := range names {
		require.True(t, used[n], "%s is not on the dashboard", n)
	}
}

// TestAlertsQueryExportedMetrics reads the compose demo's Prometheus
// alerting rules: each is complete, and every onceflow metric its
// expression names is one a service exports (an alert on a name nobody
// exports never fires).
func TestAlertsQueryExportedMetrics(t *testing.T) {
	t.Parallel()
	names := metricNames(t)
	rules, err := promdeploy.Rules()
	require.NoError(t, err)
	require.NotEmpty(t, rules)
	metric := regexp.MustCompile(`onceflow_[a-z0-9_]+`)
	for _, r := range rules {
		require.NotEmpty(t, r.Alert, "a rule with no alert name: %q", r.Expr)
		require.NotEmpty(t, r.Expr, "alert %s", r.Alert)
		require.NotEmpty(t, r.For, "alert %s has no for", r.Alert)
		require.NotEmpty(t, r.Annotations["summary"], "alert %s has no summary", r.Alert)
		for _, m := range metric.FindAllString(r.Expr, -1) {
			require.Contains(t, names, exportedName(names, m), "alert %s queries a metric nobody exports", r.Alert)
		}
	}
}
