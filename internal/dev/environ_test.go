package dev

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The relays publish atomic batches only on a JetStream that fsyncs every
// write, unless the environment says otherwise.
func TestServicesPublishAtomicallyOnlyWhereJetStreamSyncsEveryWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // OUTBOX_ATOMIC_BATCH_MIN; empty: the service's default
	}{
		{"defaults", Config{}, "0"},
		{"durable", Config{Durable: true}, ""},
		{"durable, JetStream on its interval", Config{Durable: true, NATSSync: NATSSyncInterval}, "0"},
		{"JetStream syncing always", Config{NATSSync: NATSSyncAlways}, ""},
		{"set in the environment", Config{Environ: []string{"OUTBOX_ATOMIC_BATCH_MIN=8"}}, "8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, servicesEnviron(tc.cfg)["OUTBOX_ATOMIC_BATCH_MIN"])
		})
	}
}
