package apptest

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/deploy/grafana"
)

// InboxCount returns how many messages the consumer durable settled with
// outcome ("processed", "duplicate", "retried", "dead_lettered"): the sum of
// onceflow_inbox_messages_total over event types, read from /metrics.
func (s *Service) InboxCount(t require.TestingT, durable, outcome string) int {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	return int(s.Metric(t, "onceflow_inbox_messages_total", map[string]string{"consumer": durable, "outcome": outcome}))
}

// Metric returns the sum of the series of the counter or gauge name whose
// labels include labels, read from /metrics. A series exists only once
// set, so a missing one counts 0.
//
// t is a require.TestingT so that it also takes the *assert.CollectT of
// require.EventuallyWithT, whose condition runs off the test's goroutine.
func (s *Service) Metric(t require.TestingT, name string, labels map[string]string) float64 {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
	// Not the test's context: a CollectT has none. The timeout bounds a
	// scrape of a service that hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.BaseURL+"/metrics", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET /metrics")

	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	var n float64
series:
	for _, m := range families[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue series
			}
		}
		n += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return n
}

// RequireDashboardShows checks the compose demo's Grafana dashboard against
// the metrics that c, a service's own collector, exports: the dashboard
// queries each of them, and no other metric whose name starts with prefix.
// The shared runtime's metrics are checked in internal/app.
func RequireDashboardShows(t *testing.T, prefix string, c prometheus.Collector) {
	t.Helper()
	ch := make(chan *prometheus.Desc, 16)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	fqName := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	var exported []string
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		require.NotNil(t, m, d.String())
		require.True(t, strings.HasPrefix(m[1], prefix), "%s does not start with %s", m[1], prefix)
		exported = append(exported, m[1])
	}
	queried, err := grafana.QueriedMetrics(regexp.MustCompile(regexp.QuoteMeta(prefix) + `[a-z_]+`))
	require.NoError(t, err)
	require.ElementsMatch(t, exported, queried, "metrics exported (first) and on the dashboard (second)")
}
