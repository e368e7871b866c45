package order

import (
	"fmt"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/app"
)

// Config is the order service's configuration, read from the environment.
// A zero MaxOrdersInFlight takes its default, so a Config built in code
// needs only app.Config.
type Config struct {
	app.Config

	// MaxOrdersInFlight is how many unfinished orders (PENDING or PAID) the
	// saga may have before POST /orders answers 503 with Retry-After;
	// negative means no limit.
	MaxOrdersInFlight int `env:"MAX_ORDERS_IN_FLIGHT" envDefault:"2000"`

	// OrdersPerSecond is how many orders one caller (a token's subject)
	// may place a second on average, OrdersBurst at once; past it, POST
	// /orders answers 429 with Retry-After. Zero takes the default, far
	// above what a person or the load generator sends; negative means no
	// limit. Each replica counts its own.
	OrdersPerSecond float64 `env:"ORDER_RATE_LIMIT" envDefault:"100"`
	OrdersBurst     int     `env:"ORDER_RATE_BURST" envDefault:"200"`

	// Deadline is how long the saga has to finish an order once placed;
	// past it, the expirer ends the order EXPIRED and payment and inventory
	// compensate (docs/saga.md). Zero takes DefaultDeadline; a negative one
	// is refused (every order would expire as it is placed).
	Deadline time.Duration `env:"ORDER_DEADLINE" envDefault:"15m"`
	// ExpiryInterval is the longest the expirer sleeps between two looks
	// for due orders; it wakes sooner for the earliest deadline it knows.
	// Zero takes DefaultExpiryInterval; a negative one is refused (the
	// expirer would never sleep).
	ExpiryInterval time.Duration `env:"ORDER_EXPIRY_INTERVAL" envDefault:"1s"`
}

// LoadConfig reads Config from the environment.
func LoadConfig() (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("order config: %w", err)
	}
	if err := cfg.check(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// check refuses the settings that would break the saga rather than tune
// it, whether read from the environment or built in code.
func (c Config) check() error {
	switch {
	case c.Deadline < 0:
		return fmt.Errorf("order config: ORDER_DEADLINE %s is negative: every order would expire as it is placed", c.Deadline)
	case c.ExpiryInterval < 0:
		return fmt.Errorf("order config: ORDER_EXPIRY_INTERVAL %s is negative: the expirer would look for due orders without pause", c.ExpiryInterval)
	}
	return nil
}
