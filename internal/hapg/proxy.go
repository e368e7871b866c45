package hapg

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy forwards TCP connections to a node's PostgreSQL. Once held, it
// forwards nothing more from the server to the client and drops it
// instead: a standby replicating through it receives no more WAL, whatever
// the timing, while the primary's commits go on.
type proxy struct {
	ln     net.Listener
	target string
	held   atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startProxy(target string) (*proxy, error) {
	// The kernel's port: the listener is held open for the proxy's life.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.wg.Go(p.serve)
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) hold() { p.held.Store(true) }

func (p *proxy) serve() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Go(func() { p.pipe(down) })
	}
}

// pipe forwards one connection both ways until either side closes.
func (p *proxy) pipe(down net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = down.Close()
		return
	}
	if !p.track(down, up) {
		return
	}
	var wg sync.WaitGroup
	closeBoth := func() { _ = down.Close(); _ = up.Close() }
	wg.Go(func() { defer closeBoth(); p.copy(up, down, false) })
	wg.Go(func() { defer closeBoth(); p.copy(down, up, true) })
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, down)
	delete(p.conns, up)
	p.mu.Unlock()
}

// track records the connections for close; after close it closes them and
// reports false.
func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// copy forwards src to dst; what it reads from a server (fromServer) once
// the proxy is held is dropped.
func (p *proxy) copy(dst, src net.Conn, fromServer bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !(fromServer && p.held.Load()) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// close stops accepting, closes every connection and waits for the
// forwarding goroutines.
func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
