package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/internal/natsauth"
)

// auditEnv is what `onceflow audit` reads from the environment besides the
// services' <SERVICE>_DATABASE_URLs.
type auditEnv struct {
	NATS natsauth.Client
	// ExpiryGrace is how long past its deadline an order may be open.
	ExpiryGrace time.Duration `env:"AUDIT_EXPIRY_GRACE"`
}

func runAudit(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet("audit", commandUsage("audit"), `
Checks the invariants of the order saga across the four service databases
and the JetStream streams, prints each check with its figures and
violations, and fails if any check has a violation:

  debits         each order paid at most once, for its total, as its status says
  refunds        a payment is refunded if and only if the order's stock was rejected
  money          wallet balances + debited (not refunded) payments = credits
  stock          no stock level is negative
  reservations   what was reserved for an order is what it ordered
  orders         every order terminal, with the status its payment and stock imply
  outbox         every outbox row of every service's database published
  consumers      every event processed or dead-lettered by each durable subscribed
                 to it (DLQ entries and their reasons are reported)
  notifications  one e-mail per (order, milestone), all sent

It first waits up to --wait for the system to go quiet (every order
terminal, every outbox empty, every consumer caught up, every e-mail sent).
It only reads.

Each service's database is <SERVICE>_DATABASE_URL (ORDER_DATABASE_URL,
PAYMENT_DATABASE_URL, INVENTORY_DATABASE_URL, NOTIFY_DATABASE_URL, and one
for each service added with 'onceflow new service', whose outbox and
inbox get the outbox and consumers checks); NATS is NATS_URL (default
nats://127.0.0.1:4222), reached with the operator's credentials in
NATS_CREDS (and the CAs of a tls:// server in NATS_TLS_CA).`)
	wait := fs.Duration("wait", time.Minute, "wait at most this long for the system to go quiet before checking (0: check at once)")
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "takes no arguments")
	}
	if *wait < 0 {
		return usageError(fs, "--wait must not be negative")
	}
	cfg, err := auditConfig()
	if err != nil {
		return err
	}
	cfg.Wait = *wait

	report, err := audit.Run(ctx, cfg, inv.logger)
	if err != nil {
		return err
	}
	if err := report.Print(inv.stdout); err != nil {
		return fmt.Errorf("audit: print report: %w", err)
	}
	if !report.OK() {
		return fmt.Errorf("audit: %s", report.Summary())
	}
	return nil
}

// auditConfig reads the database URL of every registered service and the
// NATS URL from the environment.
func auditConfig() (audit.Config, error) {
	var cfg audit.Config
	targets := map[string]*string{
		"order":     &cfg.OrderURL,
		"payment":   &cfg.PaymentURL,
		"inventory": &cfg.InventoryURL,
		"notify":    &cfg.NotifyURL,
	}
	var missing []string
	for _, name := range serviceNames() {
		prefix := strings.ToUpper(name) + "_"
		own, err := env.ParseAsWithOptions[databaseURL](env.Options{Prefix: prefix})
		if err != nil {
			return audit.Config{}, fmt.Errorf("audit config: %w", err)
		}
		if own.URL == "" {
			missing = append(missing, prefix+"DATABASE_URL")
		}
		if target, ok := targets[name]; ok {
			*target = own.URL
			continue
		}
		// A service added beside the four: the checks every service gets.
		if cfg.OtherURLs == nil {
			cfg.OtherURLs = make(map[string]string)
		}
		cfg.OtherURLs[name] = own.URL
	}
	if len(missing) > 0 {
		return audit.Config{}, fmt.Errorf("audit: set %s", strings.Join(missing, ", "))
	}
	e, err := env.ParseAs[auditEnv]()
	if err != nil {
		return audit.Config{}, fmt.Errorf("audit config: %w", err)
	}
	cfg.NATSURL, cfg.NATSCreds, cfg.NATSTLSCA = e.NATS.URL, e.NATS.Creds, e.NATS.TLSCA
	cfg.ExpiryGrace = e.ExpiryGrace
	return cfg, nil
}
