package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/loadgen"
)

// loadgenEnv is what `onceflow loadgen` reads from the environment.
type loadgenEnv struct {
	// OperatorSecret is the dev issuer's, for the operator's token that
	// seeds.
	OperatorSecret string `env:"ISSUER_OPERATOR_SECRET"`
}

func runLoadgen(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet("loadgen", commandUsage("loadgen"), `
Drives a running onceflow (onceflow dev by default, or any deployment) over
its HTTP APIs and reports orders/s to a terminal state and placed→confirmed
latency. It seeds customers and SKUs of its own, a few of them poor or
scarce so that some orders are rejected or cancelled, then places orders for
--duration at --rate (0: as fast as --concurrency clients can), each with an
Idempotency-Key that its retries reuse, and follows every order to its
terminal state. Latencies come from the orders' timelines: the OrderPlaced
event's time to the terminal event's, both by the order service's clock.
It sends every request with a token from --issuer-url's POST /token: a
customer's for their orders, an operator's to seed, for which the dev
issuer wants its operator secret (ISSUER_OPERATOR_SECRET, which onceflow
dev prints). POST /orders is rate-limited per customer (ORDER_RATE_LIMIT,
default 100/s): keep --rate under that many times --customers.

  onceflow loadgen --rate 300/s --duration 1m --json results.json --histogram latency.svg`)
	order := fs.String("order-url", "http://127.0.0.1:8080", "base `URL` of the order API")
	payment := fs.String("payment-url", "http://127.0.0.1:8081", "base `URL` of the payment API")
	inventory := fs.String("inventory-url", "http://127.0.0.1:8082", "base `URL` of the inventory API")
	issuer := fs.String("issuer-url", "http://127.0.0.1:8084", "base `URL` of the token issuer (onceflow's dev issuer: POST /token)")
	var rate rateFlag
	fs.Var(&rate, "rate", "orders per second, e.g. 300/s (`N/s`; 0: as fast as the clients can)")
	duration := fs.Duration("duration", 10*time.Second, "how long to place orders")
	concurrency := fs.Int("concurrency", loadgen.DefaultConcurrency, "most POST /orders in flight")
	customers := fs.Int("customers", loadgen.DefaultCustomers, "customers to seed (one in ten poor)")
	skus := fs.Int("skus", loadgen.DefaultSKUs, "SKUs to seed (one in ten scarce)")
	settle := fs.Duration("settle-timeout", loadgen.DefaultSettleTimeout, "how long to wait for the last orders to finish")
	jsonPath := fs.String("json", "", "write the results to `FILE` as JSON")
	histPath := fs.String("histogram", "", "draw the placed→confirmed latency histogram to `FILE` (.svg or .png)")
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "takes no arguments")
	}
	if *histPath != "" && !strings.HasSuffix(*histPath, ".svg") && !strings.HasSuffix(*histPath, ".png") {
		return usageError(fs, "--histogram wants a .svg or .png file")
	}
	lenv, err := env.ParseAs[loadgenEnv]()
	if err != nil {
		return fmt.Errorf("loadgen config: %w", err)
	}

	res, err := loadgen.Run(ctx, loadgen.Config{
		OrderURL:       strings.TrimSuffix(*order, "/"),
		PaymentURL:     strings.TrimSuffix(*payment, "/"),
		InventoryURL:   strings.TrimSuffix(*inventory, "/"),
		IssuerURL:      strings.TrimSuffix(*issuer, "/"),
		OperatorSecret: lenv.OperatorSecret,
		Rate:           float64(rate),
		Concurrency:    *concurrency,
		Duration:       *duration,
		SettleTimeout:  *settle,
		Customers:      *customers,
		SKUs:           *skus,
		Progress:       inv.stderr,
		TTY:            isTerminal(inv.stderr),
	})
	if res != nil {
		res.WriteText(inv.stdout)
	}
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	if *jsonPath != "" {
		if err := res.WriteJSON(*jsonPath); err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
	}
	if *histPath != "" {
		if err := res.WriteHistogram(*histPath); err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
	}
	if res.Unfinished > 0 || res.PlaceErrors > 0 {
		return fmt.Errorf("loadgen: %d orders not placed and %d not finished", res.PlaceErrors, res.Unfinished)
	}
	return nil
}

// rateFlag is an orders-per-second flag: "300/s" or "300".
type rateFlag float64

func (r *rateFlag) String() string { return strconv.FormatFloat(float64(*r), 'g', -1, 64) + "/s" }

func (r *rateFlag) Set(s string) error {
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "/s"), 64)
	if err != nil || v < 0 {
		return fmt.Errorf("%q is not a rate like 300/s", s)
	}
	*r = rateFlag(v)
	return nil
}

// isTerminal reports whether w is a terminal, which can redraw a line.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
