package order

import (
	"fmt"

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
}

// LoadConfig reads Config from the environment.
func LoadConfig() (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("order config: %w", err)
	}
	return cfg, nil
}
