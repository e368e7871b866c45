package freeport_test

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
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

// A port a Pool handed out is handed out by no other Pool, in this process
// or another, even while nothing listens on it (its server is down for a
// restart), until the first Pool is closed or its process exits.
func TestTakeSkipsPortsAnotherPoolHolds(t *testing.T) {
	dir := t.TempDir()
	holder := exec.Command(os.Args[0])
	holder.Env = append(os.Environ(), "FREEPORT_HOLD_DIR="+dir)
	stdin, err := holder.StdinPipe()
	require.NoError(t, err)
	stdout, err := holder.StdoutPipe()
	require.NoError(t, err)
	holder.Stderr = os.Stderr
	require.NoError(t, holder.Start())
	t.Cleanup(func() { _ = stdin.Close(); _ = holder.Wait() })

	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the holder's ports")
	var held []int
	for _, f := range strings.Fields(line) {
		port, err := strconv.Atoi(f)
		require.NoError(t, err, "the holder printed %q", line)
		held = append(held, port)
	}
	require.Len(t, held, 3)

	only := func(port int) *freeport.Pool { return &freeport.Pool{Dir: dir, Low: port, High: port} }
	for _, port := range held {
		require.True(t, bindable(port), "port %d: the holder does not listen on it", port)
		_, err := only(port).Take()
		require.Error(t, err, "port %d, held by another process, was handed out", port)
	}

	// Two Pools in one process: the second skips what the first holds,
	// until the first is closed.
	first := &freeport.Pool{Dir: dir}
	port, err := first.Take()
	require.NoError(t, err)
	_, err = only(port).Take()
	require.Error(t, err, "port %d, held by another Pool in this process, was handed out", port)
	require.NoError(t, first.Close())
	got, err := only(port).Take()
	require.NoError(t, err, "port %d after its Pool was closed", port)
	require.Equal(t, port, got)

	require.NoError(t, stdin.Close())
	require.NoError(t, holder.Wait())
	for _, port := range held {
		got, err := only(port).Take()
		require.NoError(t, err, "port %d after its holder exited", port)
		require.Equal(t, port, got)
	}
}

// TestMain runs the other process of TestTakeSkipsPortsAnotherPoolHolds
// when asked to, instead of the tests.
func TestMain(m *testing.M) {
	if dir := os.Getenv("FREEPORT_HOLD_DIR"); dir != "" {
		if err := holdPorts(dir); err != nil {
			_, _ = os.Stderr.WriteString("hold ports: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// holdPorts takes three ports from a Pool on dir, prints them, listens on
// none, and holds them until its standard input closes.
func holdPorts(dir string) error {
	pool := &freeport.Pool{Dir: dir}
	var ports []string
	for range 3 {
		port, err := pool.Take()
		if err != nil {
			return err
		}
		ports = append(ports, strconv.Itoa(port))
	}
	if _, err := os.Stdout.WriteString(strings.Join(ports, " ") + "\n"); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, os.Stdin)
	return err
}

func bindable(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	return l.Close() == nil
}
