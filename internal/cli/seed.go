package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/dev"
)

// seedEnv is what `onceflow seed` reads from the environment.
type seedEnv struct {
	OrderURL     string `env:"ORDER_URL" envDefault:"http://127.0.0.1:8080"`
	PaymentURL   string `env:"PAYMENT_URL" envDefault:"http://127.0.0.1:8081"`
	InventoryURL string `env:"INVENTORY_URL" envDefault:"http://127.0.0.1:8082"`
	IssuerURL    string `env:"ISSUER_URL" envDefault:"http://127.0.0.1:8084"`
	// OperatorSecret is what the issuer wants to issue an admin token.
	OperatorSecret string `env:"ISSUER_OPERATOR_SECRET"`
}

// seedSubject is the operator the seed's token names, as onceflow dev's.
const seedSubject = "dev-seed"

func runSeed(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet("seed", "", `
Writes the demo data 'onceflow dev --seed' writes into running services:
credits the wallets alice and bob, stocks apple, pear and plum, and prices
them in the order service's catalog, with an operator's token of the dev
token issuer. Idempotent: run again, it credits and stocks nothing more.
The compose demo runs it once, as the job "seed".

Environment:
  ORDER_URL      default http://127.0.0.1:8080
  PAYMENT_URL    default http://127.0.0.1:8081
  INVENTORY_URL  default http://127.0.0.1:8082
  ISSUER_URL     the dev token issuer; default http://127.0.0.1:8084
  ISSUER_OPERATOR_SECRET  what the issuer wants for an admin token (its
                 log says it where it made one up)`)
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() > 0 {
		return usageError(fs, "takes no arguments")
	}
	cfg, err := env.ParseAs[seedEnv]()
	if err != nil {
		return fmt.Errorf("seed config: %w", err)
	}
	token, err := issuerToken(ctx, cfg.IssuerURL, cfg.OperatorSecret, seedSubject)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	seeded, err := dev.SeedAt(ctx, dev.SeedTarget{
		OrderURL:     cfg.OrderURL,
		PaymentURL:   cfg.PaymentURL,
		InventoryURL: cfg.InventoryURL,
		Token:        token,
	})
	if err != nil {
		return err
	}
	for _, w := range seeded.Wallets {
		fmt.Fprintf(inv.stdout, "wallet %s: %d cents\n", w.CustomerID, w.BalanceCents)
	}
	for _, s := range seeded.Stock {
		fmt.Fprintf(inv.stdout, "stock %s: %d\n", s.SKU, s.Available)
	}
	for _, p := range seeded.Products {
		fmt.Fprintf(inv.stdout, "price %s: %d cents\n", p.SKU, p.UnitPriceCents)
	}
	return nil
}

// issuerToken asks the dev token issuer at issuerURL for an operator's
// token (role admin) naming subject, presenting its operator secret.
func issuerToken(ctx context.Context, issuerURL, secret, subject string) (string, error) {
	form := url.Values{"sub": {subject}, "role": {"admin"}}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, issuerURL+auth.TokenPath, strings.NewReader(form.Encode()))
	if err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("token from %s: %s: %s", issuerURL, resp.Status, strings.TrimSpace(string(body)))
	}
	var answer struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(body, &answer); err != nil || answer.AccessToken == "" {
		return "", fmt.Errorf("token from %s: no access_token in %q", issuerURL, body)
	}
	return answer.AccessToken, nil
}
