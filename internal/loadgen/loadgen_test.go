package loadgen_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dev"
	"github.com/onceflow/onceflow/internal/loadgen"
	"github.com/onceflow/onceflow/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// TestRunAgainstDev drives the four services of onceflow dev at a low rate
// for a few seconds: every order is placed once and finishes, outcomes are
// mixed, the figures are sane and the files are written.
func TestRunAgainstDev(t *testing.T) {
	t.Parallel()
	e := startDev(t)

	t.Run("rate", func(t *testing.T) {
		var progress bytes.Buffer
		res, err := loadgen.Run(t.Context(), loadgen.Config{
			OrderURL:     e.URL("order"),
			PaymentURL:   e.URL("payment"),
			InventoryURL: e.URL("inventory"),
			IssuerURL:    e.IssuerURL, OperatorSecret: e.Issuer.OperatorSecret(),
			Rate:     40,
			Duration: 3 * time.Second,
			// Enough poor customers and scarce SKUs in 120 orders to see
			// every outcome.
			PoorShare:   0.3,
			ScarceShare: 0.3,
			Progress:    &progress,
		})
		require.NoError(t, err)
		res.WriteText(t.Output())

		// Sanity, not performance: other tests share the machine, so the
		// rate is an upper bound that must hold, and a loose lower one.
		require.LessOrEqual(t, res.Placed, 120, "never above 40/s for 3s: orders 0 to 119, due before the end")
		require.GreaterOrEqual(t, res.Placed, 24, "40/s for 3s")
		require.Zero(t, res.PlaceErrors)
		require.Zero(t, res.Unfinished)
		require.Equal(t, res.Placed, res.Outcomes["CONFIRMED"]+res.Outcomes["REJECTED"]+res.Outcomes["CANCELLED"])
		for _, s := range []string{"CONFIRMED", "REJECTED", "CANCELLED"} {
			require.Positive(t, res.Outcomes[s], "no order %s: %v", s, res.Outcomes)
		}
		require.LessOrEqual(t, res.PlacedPerSecond, 42.0)
		// Over the placing time and the last orders' latency.
		require.Positive(t, res.FinishedPerSecond)
		require.Less(t, res.FinishedPerSecond, 1.2*res.PlacedPerSecond)
		l := res.PlacedToConfirmed
		require.Equal(t, res.Outcomes["CONFIRMED"], l.Count)
		require.Positive(t, l.P50)
		require.LessOrEqual(t, l.P50, l.P95)
		require.LessOrEqual(t, l.P95, l.P99)
		require.LessOrEqual(t, l.P99, l.Max)
		require.Less(t, l.P99, loadgen.DefaultSettleTimeout.Seconds()*1000)
		require.Equal(t, res.Placed, res.PlacedToTerminal.Count)
		sum := 0
		for _, b := range res.Histogram {
			sum += b.Count
		}
		require.Equal(t, l.Count, sum, "the histogram holds every confirmed order")
		require.Contains(t, progress.String(), "placed")

		dir := t.TempDir()
		jsonPath := filepath.Join(dir, "results.json")
		require.NoError(t, res.WriteJSON(jsonPath))
		b, err := os.ReadFile(jsonPath)
		require.NoError(t, err)
		var back loadgen.Result
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, res.Placed, back.Placed)
		require.Equal(t, res.PlacedToConfirmed, back.PlacedToConfirmed)

		svgPath := filepath.Join(dir, "latency.svg")
		require.NoError(t, res.WriteHistogram(svgPath))
		svg, err := os.ReadFile(svgPath)
		require.NoError(t, err)
		require.Contains(t, string(svg), "<svg")
		require.Contains(t, string(svg), "p99")

		pngPath := filepath.Join(dir, "latency.png")
		require.NoError(t, res.WriteHistogram(pngPath))
		f, err := os.Open(pngPath)
		require.NoError(t, err)
		defer f.Close()
		img, err := png.Decode(f)
		require.NoError(t, err)
		require.Equal(t, 900, img.Bounds().Dx())

		require.Error(t, res.WriteHistogram(filepath.Join(dir, "latency.gif")))
	})

	// Every third request is answered, but the answer is lost on the way
	// back, as in a time-out: the retry with the same key gets the stored
	// response, and no order is placed twice.
	t.Run("retries", func(t *testing.T) {
		lossy := &lossyTransport{next: &http.Transport{}}
		t.Cleanup(lossy.next.CloseIdleConnections)
		res, err := loadgen.Run(t.Context(), loadgen.Config{
			OrderURL:     e.URL("order"),
			PaymentURL:   e.URL("payment"),
			InventoryURL: e.URL("inventory"),
			IssuerURL:    e.IssuerURL, OperatorSecret: e.Issuer.OperatorSecret(),
			Concurrency: 4,
			Duration:    time.Second,
			Client:      &http.Client{Transport: lossy, Timeout: 10 * time.Second},
		})
		require.NoError(t, err)
		require.Positive(t, res.Placed)
		require.Positive(t, res.Retries)
		require.Zero(t, res.PlaceErrors)
		require.Zero(t, res.Unfinished)

		// The orders the customers have are the orders the run placed.
		total := 0
		for i := range loadgen.DefaultCustomers {
			var list struct {
				Orders []json.RawMessage `json:"orders"`
				Next   string            `json:"next"`
			}
			u := e.URL("order") + "/orders?limit=100" // the customer's own
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
			require.NoError(t, err)
			tok, err := e.Token(customerID(res.RunID, i), false)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
			resp.Body.Close()
			require.Empty(t, list.Next, "more than a page of orders")
			total += len(list.Orders)
		}
		require.Equal(t, res.Placed, total, "orders placed twice")
	})

	// Interrupted, a run reports what it measured until then.
	t.Run("interrupted", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(1500*time.Millisecond, cancel)
		res, err := loadgen.Run(ctx, loadgen.Config{
			OrderURL:     e.URL("order"),
			PaymentURL:   e.URL("payment"),
			InventoryURL: e.URL("inventory"),
			IssuerURL:    e.IssuerURL, OperatorSecret: e.Issuer.OperatorSecret(),
			Rate:     20,
			Duration: time.Minute,
		})
		require.ErrorIs(t, err, context.Canceled)
		require.NotNil(t, res)
		require.True(t, res.Interrupted)
		require.Positive(t, res.Placed)
		require.Less(t, res.Duration, 30.0)
	})
}

func startDev(t *testing.T) *dev.Env {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := dev.Start(t.Context(), dev.Config{}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	return e
}

func customerID(runID string, i int) string { return fmt.Sprintf("lg-%s-c%03d", runID, i) }

// lossyTransport loses the answer of every third POST /orders after the
// server has handled it.
type lossyTransport struct {
	next  *http.Transport
	posts atomic.Int64
}

func (l *lossyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost || req.URL.Path != "/orders" {
		return resp, err
	}
	if l.posts.Add(1)%3 == 0 {
		resp.Body.Close()
		return nil, errors.New("lost answer")
	}
	return resp, nil
}

// A run whose services or issuer are not there gives up seeding after
// SeedTimeout, naming what it could not reach, instead of retrying forever.
func TestSeedingGivesUp(t *testing.T) {
	t.Parallel()
	nobody := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePorts(t, 1)[0])
	start := time.Now()
	_, err := loadgen.Run(t.Context(), loadgen.Config{
		OrderURL: nobody, PaymentURL: nobody, InventoryURL: nobody, IssuerURL: nobody,
		Duration:    time.Second,
		SeedTimeout: time.Second,
	})
	require.ErrorContains(t, err, "seed")
	require.ErrorContains(t, err, "connection refused")
	require.Less(t, time.Since(start), 10*time.Second)
}
