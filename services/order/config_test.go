package order_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/services/order"
)

// A negative deadline (every order expired as it is placed) or expiry
// interval (an expirer that never sleeps) is refused when the
// configuration is read, saying which setting. Not parallel: it sets the
// process's environment, which LoadConfig reads.
func TestConfigRefusesNegativeDeadlines(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://unused")
	for name, value := range map[string]string{"ORDER_DEADLINE": "-1m", "ORDER_EXPIRY_INTERVAL": "-1s"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			_, err := order.LoadConfig()
			require.ErrorContains(t, err, name)
			require.ErrorContains(t, err, "negative")
		})
	}
	_, err := order.LoadConfig()
	require.NoError(t, err, "the defaults")

}
