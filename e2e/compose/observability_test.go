package compose

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The observability profile's published addresses.
const (
	prometheusURL = "http://127.0.0.1:9090"
	grafanaURL    = "http://127.0.0.1:3000"
	jaegerURL     = "http://127.0.0.1:16686"
)

// The observability profile's services: no healthcheck in the compose
// file but Prometheus's, so running is what the others can show.
var observability = []string{"prometheus", "grafana", "jaeger"}

// getJSON GETs u and decodes a 200 answer into out; it returns why not.
func (c *client) getJSON(t *testing.T, u string, out any) string {
	a, err := c.do(t.Context(), http.MethodGet, u, "", nil)
	if err != nil {
		return err.Error()
	}
	if a.status != http.StatusOK {
		return fmt.Sprintf("HTTP %d: %.300s", a.status, a.body)
	}
	if err := json.Unmarshal(a.body, out); err != nil {
		return fmt.Sprintf("%v: %.300s", err, a.body)
	}
	return ""
}

// scrapedByPrometheus: Prometheus's targets are the four services, each
// up (scraped successfully at its last try).
func scrapedByPrometheus(t *testing.T, c *client) {
	await(t, time.Minute, "Prometheus scraping the four services", func() (bool, string) {
		var targets struct {
			Data struct {
				ActiveTargets []struct {
					Labels    map[string]string `json:"labels"`
					Health    string            `json:"health"`
					LastError string            `json:"lastError"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if why := c.getJSON(t, prometheusURL+"/api/v1/targets", &targets); why != "" {
			return false, why
		}
		var up, seen []string
		for _, tg := range targets.Data.ActiveTargets {
			seen = append(seen, fmt.Sprintf("%s=%s %s", tg.Labels["service"], tg.Health, tg.LastError))
			if tg.Health == "up" {
				up = append(up, tg.Labels["service"])
			}
		}
		slices.Sort(up)
		return slices.Equal(up, []string{"inventory", "notify", "order", "payment"}), strings.Join(seen, "; ")
	})
}

// tracedInJaeger: the order's saga is one trace in Jaeger, with spans of
// the order, payment and inventory services (the traceparent travels
// through each outbox).
func tracedInJaeger(t *testing.T, c *client, orderID string) {
	tags, err := json.Marshal(map[string]string{"cloudevents.event_subject": orderID})
	require.NoError(t, err)
	q := url.Values{"service": {"onceflow-inventory"}, "tags": {string(tags)}, "limit": {"5"}, "lookback": {"1h"}}
	await(t, time.Minute, "order "+orderID+"'s trace in Jaeger", func() (bool, string) {
		var found struct {
			Data []struct {
				TraceID   string `json:"traceID"`
				Processes map[string]struct {
					ServiceName string `json:"serviceName"`
				} `json:"processes"`
			} `json:"data"`
		}
		if why := c.getJSON(t, jaegerURL+"/api/traces?"+q.Encode(), &found); why != "" {
			return false, why
		}
		if len(found.Data) == 0 {
			return false, "no trace with a span of onceflow-inventory for the order yet"
		}
		// The search returns the whole trace: every service's spans.
		var services []string
		for _, p := range found.Data[0].Processes {
			if !slices.Contains(services, p.ServiceName) {
				services = append(services, p.ServiceName)
			}
		}
		slices.Sort(services)
		ok := slices.Contains(services, "onceflow-order") && slices.Contains(services, "onceflow-payment") && slices.Contains(services, "onceflow-inventory")
		return ok, fmt.Sprintf("trace %s has spans of %v", found.Data[0].TraceID, services)
	})
}

// The panels whose series exist once orders have gone through, whatever
// else happened: the inbox's settled messages, the outbox's published
// events, the HTTP requests. The rest (duplicates, errors, dead letters,
// refusals) may rightly have no series in a run.
var panelsWithData = []string{
	"Messages settled /s by consumer and outcome",
	"Published /s by event type",
	"Requests /s by route and status",
}

// dashboardAnswers: Grafana has provisioned the onceflow dashboard, and
// each of its panels' queries, sent through Grafana's data source proxy
// to Prometheus, is accepted; those of panelsWithData return series.
func dashboardAnswers(t *testing.T, c *client) {
	var hits []struct {
		UID   string `json:"uid"`
		Title string `json:"title"`
	}
	require.Empty(t, c.getJSON(t, grafanaURL+"/api/search?query=onceflow", &hits))
	require.NotEmpty(t, hits, "Grafana has no onceflow dashboard")
	var board struct {
		Dashboard struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr       string `json:"expr"`
					Datasource struct {
						UID string `json:"uid"`
					} `json:"datasource"`
				} `json:"targets"`
			} `json:"panels"`
		} `json:"dashboard"`
	}
	require.Empty(t, c.getJSON(t, grafanaURL+"/api/dashboards/uid/"+hits[0].UID, &board))

	queries, withData := 0, 0
	for _, p := range board.Dashboard.Panels {
		count := func() int {
			series := 0
			for _, tg := range p.Targets {
				series += panelQuery(t, c, tg.Datasource.UID, tg.Expr)
			}
			return series
		}
		queries += len(p.Targets)
		series := count()
		if slices.Contains(panelsWithData, p.Title) && series == 0 {
			// A rate answers once its counter has two samples in the
			// window, scrapes 5 s apart: the counters the load began a
			// few seconds ago may have one yet (CI saw the inbox's).
			await(t, time.Minute, fmt.Sprintf("panel %q with data", p.Title), func() (bool, string) {
				series = count()
				return series > 0, fmt.Sprintf("%d series", series)
			})
		}
		if series > 0 {
			withData++
		}
	}
	t.Logf("Grafana: dashboard %q, %d queries through its data source proxy, %d of %d panels with data",
		hits[0].Title, queries, withData, len(board.Dashboard.Panels))
}

// panelQuery runs a panel's query as an instant query through Grafana's
// data source proxy and returns the number of series; Grafana's
// $__rate_interval (4 scrape intervals at least) is a minute here.
func panelQuery(t *testing.T, c *client, datasource, expr string) int {
	expr = strings.ReplaceAll(expr, "$__rate_interval", "1m")
	var result struct {
		Status string `json:"status"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	u := grafanaURL + "/api/datasources/proxy/uid/" + datasource + "/api/v1/query?" + url.Values{"query": {expr}}.Encode()
	require.Empty(t, c.getJSON(t, u, &result), "query %s", expr)
	require.Equal(t, "success", result.Status, "query %s", expr)
	return len(result.Data.Result)
}
