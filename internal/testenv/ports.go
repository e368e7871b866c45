package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

// The range FreePorts picks from: below the kernel's ephemeral ports (Linux's
// start at 32768, IANA's at 49152), which it hands to every listener on port
// 0 and to the local end of every outgoing connection. A port picked with
// net.Listen(":0") and closed again, as tests used to, is free only until the
// next of those in any process on the machine; in CI that was another test
// binary's embedded NATS server, a second before our service bound it.
const (
	lowestPort  = 20000
	highestPort = 32767
)

// FreePorts returns n TCP ports on 127.0.0.1 for servers that the test starts
// by port number, and may stop and start again on the same port. A port was
// free a moment ago and is outside the range the kernel picks from, so only
// someone asking for it by number can take it before the server binds it. No
// port is handed out twice in a test binary.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := shared.ports.take(n)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return ports
}

// portPool hands out ports for FreePorts. The zero value is ready to use.
type portPool struct {
	mu    sync.Mutex
	given map[int]bool
}

// take returns n distinct ports.
func (p *portPool) take(n int) ([]int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.given == nil {
		p.given = make(map[int]bool)
	}
	const maxTries = 10_000
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == maxTries {
			return nil, fmt.Errorf("testenv: %d free ports in %d–%d not found in %d tries", n, lowestPort, highestPort, maxTries)
		}
		port := lowestPort + rand.IntN(highestPort-lowestPort+1)
		if p.given[port] || !free(port) {
			continue
		}
		p.given[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

// free reports whether a listener could bind 127.0.0.1:port just now.
func free(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
