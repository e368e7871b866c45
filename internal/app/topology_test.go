package app

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/streams"
)

// TestASubscriptionIsADurableTheTopologyGivesTheService checks that a
// service runs only durables of its own from the topology, where their
// streams and subjects are declared.
func TestASubscriptionIsADurableTheTopologyGivesTheService(t *testing.T) {
	require.NoError(t, inTopology("payment", []Subscription{{Durable: streams.PaymentOrders}, {Durable: streams.PaymentExpiries}}))
	require.Equal(t, streams.Orders, streamOf(saga(), streams.PaymentOrders))
	require.ErrorContains(t, inTopology("payment", []Subscription{{Durable: "payment-typo"}}),
		"subscription payment-typo: no such durable in the topology")
	require.ErrorContains(t, inTopology("payment", []Subscription{{Durable: streams.NotifyOrders}}),
		"the topology gives the durable to notify, not payment")
}
