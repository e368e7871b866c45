package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/postgres"
	"github.com/onceflow/onceflow/internal/streams"
)

const (
	defaultPollInterval = 200 * time.Millisecond
	// progressInterval is how often the wait logs what is still moving.
	progressInterval = 5 * time.Second
)

// Config says where the system to audit is and how long to let it settle.
type Config struct {
	// The four service databases. The auditor only reads them.
	OrderURL, PaymentURL, InventoryURL, NotifyURL string
	// OtherURLs are the databases of the services added beside the four
	// (onceflow new service), by service name: their outbox and their
	// inbox get the checks every service gets (every outbox row published,
	// every event on a durable of theirs processed or dead-lettered).
	OtherURLs map[string]string
	// NATSURL is the NATS server with the saga's streams.
	NATSURL string
	// NATSCreds and NATSTLSCA are the operator's credentials file and the
	// CAs of a tls:// server (natsauth.Client); empty for none.
	NATSCreds, NATSTLSCA string
	// Wait bounds the wait for the system to go quiet before the checks run:
	// every order terminal, every outbox empty, every consumer caught up,
	// every e-mail sent. Zero checks at once. A system that is not quiet when
	// the wait ends is checked anyway; what it was still doing shows up as
	// violations.
	Wait time.Duration
	// PollInterval is how often quiet is polled during Wait; default 200ms.
	PollInterval time.Duration
	// ExpiryGrace is how long past its deadline an order may still be open
	// (the expirer's round, a restart of the order service); default 30s.
	ExpiryGrace time.Duration
}

// Run audits the system of cfg and returns its report. The error is for an
// audit that could not be made (a database or NATS unreachable); violations
// are in the report (see Report.OK).
func Run(ctx context.Context, cfg Config, logger *slog.Logger) (Report, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg.PollInterval = cmp.Or(cfg.PollInterval, defaultPollInterval)
	if cfg.OrderURL == "" || cfg.PaymentURL == "" || cfg.InventoryURL == "" || cfg.NotifyURL == "" || cfg.NATSURL == "" {
		return Report{}, errors.New("audit: the four database URLs and the NATS URL are required")
	}
	sys, err := connect(ctx, cfg)
	if err != nil {
		return Report{}, err
	}
	defer sys.close()

	start := time.Now()
	unquiet, err := sys.waitQuiet(ctx, cfg.Wait, cfg.PollInterval, logger)
	if err != nil {
		return Report{}, err
	}
	report := Report{Waited: time.Since(start), Unquiet: unquiet}
	snap, err := sys.snapshot(ctx)
	if err != nil {
		return Report{}, err
	}
	snap.expiryGrace = cmp.Or(cfg.ExpiryGrace, defaultExpiryGrace)
	report.Checks = snap.checks()
	logger.DebugContext(ctx, "audit done", "violations", report.Violations(), "waited", report.Waited)
	return report, nil
}

// Service database names, as the services call themselves.
const (
	serviceOrder     = "order"
	servicePayment   = "payment"
	serviceInventory = "inventory"
	serviceNotify    = "notify"
)

// database is one service's database.
type database struct {
	service string
	pool    *pgxpool.Pool
}

// system is the connections to what is audited.
type system struct {
	order, payment, inventory, notify database
	others                            []database // by service name
	nc                                *nats.Conn
	js                                jetstream.JetStream
	topology                          streams.Topology
}

func connect(ctx context.Context, cfg Config) (_ *system, err error) {
	sys := &system{topology: streams.Saga(streams.Config{})}
	defer func() {
		if err != nil {
			sys.close()
		}
	}()
	for _, db := range []struct {
		service, url string
		into         *database
	}{
		{serviceOrder, cfg.OrderURL, &sys.order},
		{servicePayment, cfg.PaymentURL, &sys.payment},
		{serviceInventory, cfg.InventoryURL, &sys.inventory},
		{serviceNotify, cfg.NotifyURL, &sys.notify},
	} {
		pool, err := postgres.Connect(ctx, db.url)
		if err != nil {
			return nil, fmt.Errorf("audit: %s database: %w", db.service, err)
		}
		*db.into = database{service: db.service, pool: pool}
	}
	for _, service := range slices.Sorted(maps.Keys(cfg.OtherURLs)) {
		pool, err := postgres.Connect(ctx, cfg.OtherURLs[service])
		if err != nil {
			return nil, fmt.Errorf("audit: %s database: %w", service, err)
		}
		sys.others = append(sys.others, database{service: service, pool: pool})
	}
	client := natsauth.Client{URL: cfg.NATSURL, Creds: cfg.NATSCreds, TLSCA: cfg.NATSTLSCA}
	nc, err := nats.Connect(cfg.NATSURL, append(client.Options(streams.Operator), nats.Name("onceflow-audit"))...)
	if err != nil {
		return nil, fmt.Errorf("audit: connect to nats: %w", err)
	}
	sys.nc = nc
	if sys.js, err = jetstream.New(nc); err != nil {
		return nil, fmt.Errorf("audit: jetstream: %w", err)
	}
	return sys, nil
}

func (s *system) close() {
	for _, db := range s.databases() {
		if db.pool != nil {
			db.pool.Close()
		}
	}
	if s.nc != nil {
		s.nc.Close()
	}
}

// databases returns the four databases — order, payment, inventory,
// notify — and the others'.
func (s *system) databases() []database {
	return append([]database{s.order, s.payment, s.inventory, s.notify}, s.others...)
}
