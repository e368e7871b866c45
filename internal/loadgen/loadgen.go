package loadgen

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Defaults of Config.
const (
	DefaultConcurrency    = 64
	DefaultCustomers      = 20
	DefaultSKUs           = 20
	DefaultRequestTimeout = 10 * time.Second
	DefaultSettleTimeout  = time.Minute
	DefaultSeedTimeout    = time.Minute
	// DefaultPollInterval is a second because following the orders loads
	// the system under test (a poll reads every pending order with its
	// lines and timeline): at 250ms, the reads cost about a tenth of a
	// 2-core machine at 900 orders/s.
	DefaultPollInterval = time.Second
	DefaultPoorShare    = 0.03
	DefaultScarceShare  = 0.03
)

// Config configures Run. Zero values take the defaults.
type Config struct {
	// OrderURL, PaymentURL and InventoryURL are the base URLs of the three
	// APIs, e.g. http://127.0.0.1:8080.
	OrderURL, PaymentURL, InventoryURL string
	// IssuerURL is the token issuer's base URL (onceflow's dev issuer,
	// e.g. http://127.0.0.1:8084): the run asks its POST /token for a
	// token per customer, and an operator's to seed.
	IssuerURL string
	// OperatorSecret is what the issuer wants, as a bearer token, for an
	// operator's token (the dev issuer's ISSUER_OPERATOR_SECRET, which
	// onceflow dev prints).
	OperatorSecret string
	// Rate is the target of orders placed per second; zero places them as
	// fast as Concurrency clients can.
	Rate float64
	// Concurrency bounds the POST /orders requests in flight (default 64).
	// At a Rate the clients cannot keep up with, the achieved rate is lower,
	// and Result says so.
	Concurrency int
	// Duration is how long orders are placed. Run then waits up to
	// SettleTimeout (default 1m) for the last of them to finish.
	Duration      time.Duration
	SettleTimeout time.Duration
	// SeedTimeout bounds the seeding (default 1m): its requests are
	// retried while the services start, not forever against one that is
	// down or an issuer that is not there.
	SeedTimeout time.Duration
	// Customers and SKUs are how many of each the run seeds (default 20
	// each); one in ten of each (at least one) is poor or scarce.
	Customers, SKUs int
	// PoorShare and ScarceShare are the shares of orders placed by a poor
	// customer and with a scarce SKU (default 3% each; negative means none).
	PoorShare, ScarceShare float64
	// RequestTimeout bounds one HTTP request (default 10s).
	RequestTimeout time.Duration
	// PollInterval is how often unfinished orders are looked at (default
	// 1s). It does not affect the latencies, which come from the orders'
	// timelines.
	PollInterval time.Duration
	// RunID names the run's customers, SKUs and keys; default random.
	RunID string
	// Client sends the requests; default a client with RequestTimeout.
	Client *http.Client
	// Progress, when set, receives a progress line a few times a second; a
	// terminal shows it in place (TTY true), anything else gets a line
	// every few seconds.
	Progress io.Writer
	TTY      bool
}

func (cfg *Config) defaults() error {
	if cfg.OrderURL == "" || cfg.PaymentURL == "" || cfg.InventoryURL == "" || cfg.IssuerURL == "" {
		return errors.New("the order, payment, inventory and issuer URLs are required")
	}
	if cfg.Duration <= 0 {
		return fmt.Errorf("duration %s must be positive", cfg.Duration)
	}
	if cfg.Rate < 0 || math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0) {
		return fmt.Errorf("rate %v must be a number of orders per second, or 0", cfg.Rate)
	}
	cfg.Concurrency = cmp.Or(max(cfg.Concurrency, 0), DefaultConcurrency)
	cfg.Customers = cmp.Or(max(cfg.Customers, 0), DefaultCustomers)
	cfg.SKUs = cmp.Or(max(cfg.SKUs, 0), DefaultSKUs)
	cfg.SettleTimeout = cmp.Or(max(cfg.SettleTimeout, 0), DefaultSettleTimeout)
	cfg.SeedTimeout = cmp.Or(max(cfg.SeedTimeout, 0), DefaultSeedTimeout)
	cfg.RequestTimeout = cmp.Or(max(cfg.RequestTimeout, 0), DefaultRequestTimeout)
	cfg.PollInterval = cmp.Or(max(cfg.PollInterval, 0), DefaultPollInterval)
	cfg.PoorShare = cmp.Or(cfg.PoorShare, DefaultPoorShare)
	cfg.ScarceShare = cmp.Or(cfg.ScarceShare, DefaultScarceShare)
	if cfg.RunID == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.RunID = hex.EncodeToString(b)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{
			Timeout: cfg.RequestTimeout,
			Transport: &http.Transport{
				MaxIdleConns:        2 * cfg.Concurrency,
				MaxIdleConnsPerHost: 2 * cfg.Concurrency,
				IdleConnTimeout:     30 * time.Second,
			},
		}
	}
	return nil
}

// Run seeds, places orders for cfg.Duration, follows them to their
// terminal states and returns what it measured. It fails only when it
// cannot seed or ctx ends, and then returns what it measured until then
// too, if anything; orders that could not be placed or did not finish are
// counted in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if t, ok := cfg.Client.Transport.(*http.Transport); ok {
		defer t.CloseIdleConnections()
	}
	c := &client{http: cfg.Client, cfg: cfg}
	seedCtx, cancel := context.WithTimeout(ctx, cfg.SeedTimeout)
	world, err := seed(seedCtx, c, cfg)
	cancel()
	if err != nil {
		return nil, err
	}

	r := &run{cfg: cfg, client: c, world: world, tracker: newTracker()}
	start := time.Now()
	placingDone := make(chan struct{})
	progressCtx, stopProgress := context.WithCancel(ctx)
	defer stopProgress()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(placingDone)
		r.place(gctx, start)
		return nil
	})
	g.Go(func() error {
		// follow returns once every placed order finished or the settle
		// time-out passed; the progress line ends with it.
		defer stopProgress()
		return r.follow(gctx, placingDone)
	})
	if cfg.Progress != nil {
		g.Go(func() error {
			r.progress(progressCtx, start, placingDone)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		// Interrupted: what was measured so far is still worth reporting.
		res := r.result(start)
		res.Interrupted = true
		return res, err
	}
	return r.result(start), nil
}

// run is the state of one Run.
type run struct {
	cfg     Config
	client  *client
	world   *world
	tracker *tracker

	placingEnded atomic.Int64 // unix nanos when placing stopped
	placeErrors  atomic.Int64
	retries      atomic.Int64
	pollRequests atomic.Int64

	mu           sync.Mutex
	placeLatency []time.Duration // client-side POST latency, retries included
	errorSamples []string
}
