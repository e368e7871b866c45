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
//
// Somebody asking by number is another Pool, often in another process: go
// test runs a module's test binaries side by side. A port whose server is
// down for a restart binds again, so a bind check alone hands it out; in CI
// a NATS node killed by the fault suite could not come back because another
// test binary's server had its monitor port. A Pool therefore also reserves
// each port it hands out, with an exclusive flock(2) on a file named after
// the port in a directory every process shares (DefaultDir). The reservation lasts until
// Close, or until the process exits, when the kernel drops the lock.
package freeport

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// The default range ports are picked from.
const (
	Lowest  = 20000
	Highest = 32767
)

// Pool hands out ports that were free a moment ago and that no other Pool,
// in this process or another, holds. The zero value picks from Lowest to
// Highest; a Pool is safe for concurrent use and must not be copied once
// used.
type Pool struct {
	// Low and High narrow the range; zero means Lowest and Highest.
	Low, High int
	// Dir holds the reservations; empty means DefaultDir. Pools share
	// reservations only through the same Dir.
	Dir string

	mu      sync.Mutex
	lockDir string           // Dir or DefaultDir, made by the first Take
	held    map[int]*os.File // the reservations' locked files
}

// DefaultDir holds reservations unless Pool.Dir says otherwise. It is /tmp
// itself, not os.TempDir: ports are the machine's, so every process must
// find the same directory whatever its TMPDIR.
const DefaultDir = "/tmp/onceflow-ports"

// maxTries bounds the ports Take tries before it gives up.
const maxTries = 1000

// Take returns a port, reserved until Close.
func (p *Pool) Take() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lockDir == "" {
		dir, err := makeDir(cmp.Or(p.Dir, DefaultDir))
		if err != nil {
			return 0, err
		}
		p.lockDir, p.held = dir, make(map[int]*os.File)
	}
	low, high := cmp.Or(p.Low, Lowest), cmp.Or(p.High, Highest)
	for range maxTries {
		port := low + rand.IntN(high-low+1)
		if p.held[port] != nil {
			continue
		}
		lock, err := reserve(p.lockDir, port)
		if err != nil {
			return 0, err
		}
		if lock == nil {
			continue // another Pool holds it
		}
		if !free(port) {
			_ = lock.Close()
			continue
		}
		p.held[port] = lock
		return port, nil
	}
	return 0, fmt.Errorf("no free port in %d–%d after %d tries", low, high, maxTries)
}

// Close gives up the Pool's reservations; the ports it handed out may then
// go to another Pool.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for port, lock := range p.held {
		errs = append(errs, lock.Close())
		delete(p.held, port)
	}
	return errors.Join(errs...)
}

// makeDir makes the reservations' directory dir if missing and returns it.
// Anybody may add to it (mode 1777, as /tmp), since every user's Pools
// share the range.
func makeDir(dir string) (string, error) {
	switch err := os.Mkdir(dir, 0o700); {
	case err == nil:
		if err := os.Chmod(dir, 0o777|fs.ModeSticky); err != nil {
			return "", fmt.Errorf("freeport: open the reservations' directory to all users: %w", err)
		}
	case !errors.Is(err, fs.ErrExist):
		return "", fmt.Errorf("freeport: make the reservations' directory: %w", err)
	}
	return dir, nil
}

// reserve takes the lock on port's file in dir, returning the locked file,
// or nil if somebody else holds it. A read-only descriptor locks as well, so
// a file another user made serves everybody. The files are never removed: removing
// one while another process opens it would let two processes lock
// different files for one port.
func reserve(dir string, port int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_RDONLY|os.O_CREATE, 0o644)
	if errors.Is(err, fs.ErrPermission) {
		return nil, nil // a file we may not even read: skip the port
	}
	if err != nil {
		return nil, fmt.Errorf("freeport: reserve port %d: %w", port, err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		_ = f.Close()
		return nil, nil
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("freeport: lock port %d's reservation: %w", port, err)
	}
	return f, nil
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
