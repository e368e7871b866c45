// Package freeport picks TCP ports on 127.0.0.1 for servers that are started
// by port number and may be stopped and started again on the same port: a
// test's NATS server, a local PostgreSQL, a service under test.
//
// The usual way, net.Listen on port 0 and closing the listener again, gives a
// port from the kernel's ephemeral range, and the kernel hands that range out
// again to every listener on port 0 and to the local end of every outgoing
// connection, in any process on the machine. A port got that way is free only
// until the next of those: in CI it was another test binary's embedded NATS
// server that took one, a second before the service it was picked for bound
// it. freeport picks from below that range instead (Linux's starts at 32768,
// IANA's at 49152), where only somebody asking for a port by number can take
// it.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// The range ports are picked from.
const (
	Lowest  = 20000
	Highest = 32767
)

// Pool hands out ports that were free a moment ago, never one twice. The
// zero value is ready to use; a Pool is safe for concurrent use.
type Pool struct {
	mu    sync.Mutex
	given map[int]bool
}

// maxTries bounds the ports Take tries before it gives up.
const maxTries = 1000

// Take returns a port.
func (p *Pool) Take() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.given == nil {
		p.given = make(map[int]bool)
	}
	for range maxTries {
		port := Lowest + rand.IntN(Highest-Lowest+1)
		if p.given[port] || !free(port) {
			continue
		}
		p.given[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free port in %d–%d after %d tries", Lowest, Highest, maxTries)
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
