package cli

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/internal/auth"
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
	// Auth, with AUTH_JWKS_URL set, lets the services' operators act with
	// their JWTs (role admin), recorded by their subject.
	Auth auth.Config
	// Hosts are the Host headers the console answers (DNS rebinding);
	// default its address and, on a loopback or unspecified one, the
	// loopback names with its port.
	Hosts []string `env:"CONSOLE_HOSTS"`
	// SessionTTL bounds a sign-in (and the token's expiry, if sooner).
	SessionTTL time.Duration `env:"CONSOLE_SESSION_TTL" envDefault:"12h"`
	// SecureCookie marks the sign-in cookie Secure, for a console behind a
	// TLS-terminating proxy.
	SecureCookie bool `env:"CONSOLE_SECURE_COOKIE"`
}

// config is the console's configuration from c, reading acfg's system.
func (c consoleEnv) config(acfg audit.Config, a console.Authorizer, hint string) console.Config {
	return console.Config{Audit: acfg, Auth: a, AuthHint: hint, Hosts: c.Hosts, SessionTTL: c.SessionTTL, SecureCookie: c.SecureCookie}
}

// authorizer is who may act from the console: the holders of the shared
// token, if set, and of an operator's JWT that verifier accepts, if any.
func (c consoleEnv) authorizer(verifier *auth.Verifier) console.Authorizer {
	var auths console.AnyOf
	if c.OperatorToken != "" {
		auths = append(auths, console.TokenAuth{Token: c.OperatorToken, Name: c.OperatorName})
	}
	if verifier != nil {
		auths = append(auths, console.JWTAuth{Verifier: verifier})
	}
	if len(auths) == 0 {
		return nil
	}
	return auths
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

It shows all this to operators only: one signs in with a JWT of the
services' identity provider (AUTH_JWKS_URL, AUTH_ISSUER, AUTH_AUDIENCE)
whose roles have admin, recorded by its subject, or with
CONSOLE_OPERATOR_TOKEN (recorded as CONSOLE_OPERATOR_NAME); one of the two
is required. A sign-in is a session the console keeps (the browser's
cookie holds only its id): it ends at sign-out, after CONSOLE_SESSION_TTL
(default 12h) or when the token expires, whichever comes first, and when
the console restarts; set CONSOLE_SECURE_COOKIE behind a TLS proxy.

It answers only the Host names in CONSOLE_HOSTS (comma-separated, "name"
or "name:port"; default its address and, on a loopback or unspecified
one, localhost, 127.0.0.1 and [::1] with its port): a page of another
site whose name resolves to the console (DNS rebinding) is refused.`)
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
	var verifier *auth.Verifier
	if cenv.Auth.JWKSURL != "" {
		if verifier, err = auth.NewVerifier(ctx, cenv.Auth, inv.logger); err != nil {
			return fmt.Errorf("console: %w", err)
		}
	}
	authorizer := cenv.authorizer(verifier)
	if authorizer == nil {
		return errors.New("console: nobody could sign in: set AUTH_JWKS_URL (operators' JWTs) or CONSOLE_OPERATOR_TOKEN")
	}
	cfg := cenv.config(acfg, authorizer,
		"An operator's JWT (role admin) from the services' identity provider, or the console's CONSOLE_OPERATOR_TOKEN.")
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
	cenv.OperatorToken = cmp.Or(cenv.OperatorToken, rand.Text())
	serveCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	verifier, err := auth.NewVerifier(serveCtx, e.AuthConfig(), inv.logger)
	if err != nil {
		cancel()
		return "", "", nil, fmt.Errorf("console: %w", err)
	}
	cfg := cenv.config(devAuditConfig(e), cenv.authorizer(verifier), "onceflow dev printed it: $ADMIN, or the console's operator token.")
	srv, err := console.New(ctx, cfg, inv.logger)
	if err != nil {
		cancel()
		return "", "", nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		cancel()
		srv.Close()
		return "", "", nil, fmt.Errorf("console: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(serveCtx, ln) }()
	return "http://" + ln.Addr().String(), cenv.OperatorToken, func() error {
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
