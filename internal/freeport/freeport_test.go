package freeport_test

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/freeport"
)

// Ports from a Pool are distinct, bindable, and outside the range the kernel
// hands to port-0 listeners and outgoing connections, so that nothing else
// on the machine takes them by chance.
func TestTake(t *testing.T) {
	ephemeralLow := 32768 // Linux's default, below IANA's 49152
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fields := strings.Fields(string(b))
		require.Len(t, fields, 2)
		ephemeralLow, err = strconv.Atoi(fields[0])
		require.NoError(t, err)
	}

	var pool freeport.Pool
	seen := make(map[int]bool)
	for range 50 {
		port, err := pool.Take()
		require.NoError(t, err)
		require.False(t, seen[port], "port %d handed out twice", port)
		seen[port] = true
		require.Less(t, port, ephemeralLow, "port %d is in the kernel's ephemeral range", port)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		require.NoError(t, err, "port %d", port)
		require.NoError(t, l.Close())
	}
}
