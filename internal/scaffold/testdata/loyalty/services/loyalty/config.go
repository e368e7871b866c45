package loyalty

import (
	"fmt"

	"github.com/caarlos0/env/v11"

	"github.com/onceflow/onceflow/internal/app"
)

// Config is the loyalty service's configuration, read from the environment.
type Config struct {
	app.Config
}

// LoadConfig reads Config from the environment.
func LoadConfig() (Config, error) {
	cfg, err := env.ParseAs[Config]()
	if err != nil {
		return Config{}, fmt.Errorf("loyalty config: %w", err)
	}
	return cfg, nil
}
