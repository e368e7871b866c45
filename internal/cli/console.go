package cli

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/internal/console"
	"github.com/onceflow/onceflow/internal/dev"
	"github.com/onceflow/onceflow/internal/streams"
)

// consoleEnv is what `onceflow console` reads from the environment besides
// the four <SERVICE>_DATABASE_URLs and NATS_URL.
type consoleEnv struct {
	Addr string `env:"CONSOLE_ADDR" envDefault:"127.0.0.1:8090"`
	// OperatorToken is the token an operator signs in with to replay and
	// discard; empty, nobody can.
	OperatorToken string `env:"CONSOLE_OPERATOR_TOKEN"`
	// OperatorName is who that token's holder is recorded as.
	OperatorName string `env:"CONSOLE_OPERATOR_NAME" envDefault:"operator"`
}

// defaultConsolePort is where `onceflow dev` serves the console.
const defaultConsolePort = 8090

func runConsole(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet("console", "", `
Serves the operator's web console on CONSOLE_ADDR (default
127.0.0.1:8090): the orders with their sagas drawn as lanes, live; the
pipeline's lag (outboxes, consumers, open dead letters); the DLQ with
replay and discard; the audit on demand. It reads the four service
databases (<SERVICE>_DATABASE_URL, as 'onceflow audit') and NATS_URL.

Replaying and discarding need an operator: one signs in with
CONSOLE_OPERATOR_TOKEN (recorded as CONSOLE_OPERATOR_NAME); unset, nobody
can act from the console.`)
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "takes no arguments")
	}
	acfg, err := auditConfig()
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	cenv, err := env.ParseAs[consoleEnv]()
	if err != nil {
		return fmt.Errorf("console config: %w", err)
	}
	cfg := console.Config{Audit: acfg, AuthHint: "It is the console's CONSOLE_OPERATOR_TOKEN."}
	if cenv.OperatorToken != "" {
		cfg.Auth = console.TokenAuth{Token: cenv.OperatorToken, Name: cenv.OperatorName}
	}
	srv, err := console.New(ctx, cfg, inv.logger)
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", cenv.Addr)
	if err != nil {
		return fmt.Errorf("console: listen on %s: %w", cenv.Addr, err)
	}
	inv.logger.InfoContext(ctx, "console serving", "url", "http://"+ln.Addr().String())
	return srv.Serve(ctx, ln)
}

// serveDevConsole serves the console of e on host:port until stop is
// called, with a fresh operator token (or CONSOLE_OPERATOR_TOKEN's), and
// returns its URL and the token.
func serveDevConsole(ctx context.Context, inv invocation, e *dev.Env, host string, port int) (url, token string, stop func() error, err error) {
	cenv, err := env.ParseAs[consoleEnv]()
	if err != nil {
		return "", "", nil, fmt.Errorf("console config: %w", err)
	}
	token = cenv.OperatorToken
	if token == "" {
		token = rand.Text()
	}
	cfg := console.Config{
		Audit:    devAuditConfig(e),
		Auth:     console.TokenAuth{Token: token, Name: cenv.OperatorName},
		AuthHint: "onceflow dev printed it (or set CONSOLE_OPERATOR_TOKEN).",
	}
	srv, err := console.New(ctx, cfg, inv.logger)
	if err != nil {
		return "", "", nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		srv.Close()
		return "", "", nil, fmt.Errorf("console: %w", err)
	}
	serveCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(serveCtx, ln) }()
	return "http://" + ln.Addr().String(), token, func() error {
		cancel()
		err := <-done
		srv.Close()
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}, nil
}

// devAuditConfig names e's databases and NATS as the auditor reads them.
func devAuditConfig(e *dev.Env) audit.Config {
	cfg := audit.Config{NATSURL: e.NATSURL, NATSCreds: e.NATSCreds[streams.Operator]}
	for _, s := range e.Services {
		switch s.Name {
		case "order":
			cfg.OrderURL = s.DatabaseURL
		case "payment":
			cfg.PaymentURL = s.DatabaseURL
		case "inventory":
			cfg.InventoryURL = s.DatabaseURL
		case "notify":
			cfg.NotifyURL = s.DatabaseURL
		}
	}
	return cfg
}
