package cli

import (
	"context"
	"fmt"
	"net"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/auth"
)

// issuerEnv is what `onceflow issuer` reads from the environment.
type issuerEnv struct {
	Addr string `env:"ISSUER_ADDR" envDefault:"127.0.0.1:8084"`
	auth.IssuerConfig
}

func runIssuer(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet("issuer", "", `
Runs the dev token issuer alone, as 'onceflow dev' runs it beside the
services (and as the compose file does): it makes a signing key at start and
serves

  GET  /.well-known/jwks.json   the keys, for the services' AUTH_JWKS_URL
  POST /token                   form fields sub, role=admin and email (the
                                last two optional): {"access_token": …}

Anyone who reaches it gets any customer's token they ask for; an admin
token (role=admin) only with the operator secret as a bearer token
(-H "Authorization: Bearer $SECRET"), which it logs at start. POST /token
answers only requests for its own host names (DNS rebinding). It is for
development and tests, never for production, where the services point
AUTH_JWKS_URL, AUTH_ISSUER and AUTH_AUDIENCE at a real identity provider.

Environment:
  ISSUER_ADDR             default 127.0.0.1:8084
  AUTH_ISSUER             the tokens' iss; default http://ISSUER_ADDR
  AUTH_AUDIENCE           the tokens' aud; default onceflow
  AUTH_TOKEN_TTL          how long a token is valid; default 12h
  ISSUER_OPERATOR_SECRET  what an admin token needs; default a fresh one
  ISSUER_HOSTS            host names POST /token answers besides
                          AUTH_ISSUER's (and the loopback names with its
                          port), comma-separated`)
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "takes no arguments")
	}
	cfg, err := env.ParseAs[issuerEnv]()
	if err != nil {
		return fmt.Errorf("issuer config: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("issuer: listen on %s: %w", cfg.Addr, err)
	}
	if cfg.Issuer == "" {
		// The address listened on: its port, when ISSUER_ADDR's is 0.
		cfg.Issuer = "http://" + ln.Addr().String()
	}
	iss, err := auth.NewIssuer(ctx, cfg.IssuerConfig)
	if err != nil {
		ln.Close()
		return err
	}
	inv.logger.InfoContext(ctx, "dev token issuer started", "addr", ln.Addr().String(), "iss", cfg.Issuer, "aud", cfg.Audience,
		"operator_secret", iss.OperatorSecret())
	return iss.Serve(ctx, ln, inv.logger)
}
