package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// natsServer is a nats-server process with JetStream on a store directory
// of its own. It can be killed and started again on the same port and store,
// as a broker crash and recovery would.
type natsServer struct {
	bin      string
	confPath string
	logPath  string
	port     int
	monitor  int    // the HTTP monitoring port: /healthz
	name     string // its server_name, on a cluster

	mu   sync.Mutex
	proc *process // nil while down
}

// natsConfig is deploy/nats/onceflow.conf's JetStream settings on the test's
// ports and store: above all sync_interval always, without which a killed
// server may lose messages it acknowledged, and with them events the outbox
// relay marked sent.
const natsConfig = `# Written by the e2e suite; see deploy/nats/onceflow.conf.
server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream {
  store_dir: %q
  max_file_store: 1GB
  sync_interval: always
}
`

// startNATS starts a server whose files live in dir, listening for clients
// on port and for monitoring on monitor, trusting the identities of
// authConf (natsauth's server configuration).
func startNATS(ctx context.Context, bin, dir, authConf string, port, monitor int) (*natsServer, error) {
	n := &natsServer{
		bin:      bin,
		confPath: filepath.Join(dir, "nats.conf"),
		logPath:  filepath.Join(dir, "nats-server.log"),
		port:     port,
		monitor:  monitor,
	}
	conf := authConf + fmt.Sprintf(natsConfig, "e2e", port, monitor, filepath.Join(dir, "jetstream"))
	if err := os.WriteFile(n.confPath, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("write nats config: %w", err)
	}
	if err := n.start(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

func (n *natsServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", n.port) }

// start starts the server if it is down and waits until JetStream is ready.
func (n *natsServer) start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		return errors.New("nats-server is already running")
	}
	p, err := startProcess(n.bin, []string{"-c", n.confPath}, os.Environ(), n.logPath)
	if err != nil {
		return fmt.Errorf("start nats-server: %w", err)
	}
	if err := n.waitReady(ctx, p); err != nil {
		p.signal(syscall.SIGKILL)
		<-p.done
		return err
	}
	n.proc = p
	return nil
}

// waitReady polls /healthz, which answers 200 once JetStream has recovered
// its streams.
func (n *natsServer) waitReady(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", n.monitor)
	var last error
	for {
		if last = probe(ctx, url); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("nats-server exited during start-up (%v); log %s:\n%s", p.err, n.logPath, tailFile(n.logPath, 20))
		case <-ctx.Done():
			return fmt.Errorf("nats-server not ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// running reports whether the server is up.
func (n *natsServer) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil
}

// freeze stops the server (SIGSTOP) where it is: it answers nothing more,
// and kill ends it there.
func (n *natsServer) freeze() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		n.proc.signal(syscall.SIGSTOP)
	}
}

// kill kills the server with SIGKILL and waits until it is gone.
func (n *natsServer) kill() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return errors.New("nats-server is not running")
	}
	n.proc.signal(syscall.SIGKILL)
	<-n.proc.done
	n.proc = nil
	return nil
}

// stop shuts the server down gracefully, killing it after 10 seconds.
func (n *natsServer) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		n.proc.stop(10 * time.Second)
		n.proc = nil
	}
}

// process is one run of a child process whose output goes to a log file.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
	err  error         // its exit status; read after done is closed
}

// startProcess starts bin with args and env, appending its stdout and
// stderr to logPath.
func startProcess(bin string, args, env []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer logFile.Close() // the child has its own descriptor
	fmt.Fprintf(logFile, "==== e2e: %s starting %s %v\n", time.Now().Format(time.RFC3339Nano), filepath.Base(bin), args)

	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group, out of reach of a terminal's SIGINT.
		Setpgid: true,
		// Die with the test binary (sent when the thread that started the
		// child exits; Go does not end threads on its own).
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) signal(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig) // fails only when it has exited
}

// stop sends SIGTERM and waits for the exit, killing the process after
// timeout. It reports whether the process exited on its own in time.
func (p *process) stop(timeout time.Duration) bool {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		p.signal(syscall.SIGKILL)
		<-p.done
		return false
	}
}

// killedBySignal reports whether the process died of sig. Call it after
// done is closed.
func (p *process) killedBySignal(sig syscall.Signal) bool {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// probe GETs url and reports an error unless it answers 200.
func probe(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// probeClient keeps no idle connections: they would outlive the test as
// goroutines.
var probeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
