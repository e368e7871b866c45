// Code rendered by `onceflow new service` from
// internal/scaffold/templates/registry.go.tmpl; keep the two identical.

package registry

import (
	"github.com/onceflow/onceflow/internal/app"
	"github.com/onceflow/onceflow/services/inventory"
	"github.com/onceflow/onceflow/services/notify"
	"github.com/onceflow/onceflow/services/order"
	"github.com/onceflow/onceflow/services/payment"
)

// Services returns every service: the saga's four in its order (the order
// of onceflow dev's ports), then the services added later.
func Services() []Service {
	return []Service{
		Of(order.Name, order.LoadConfig, order.Run, func(c *order.Config) *app.Config { return &c.Config }),
		Of(payment.Name, payment.LoadConfig, payment.Run, func(c *payment.Config) *app.Config { return &c.Config }),
		Of(inventory.Name, inventory.LoadConfig, inventory.Run, func(c *inventory.Config) *app.Config { return &c.Config }),
		Of(notify.Name, notify.LoadConfig, notify.Run, func(c *notify.Config) *app.Config { return &c.Config }),
	}
}
