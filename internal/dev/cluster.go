package dev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/freeport"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
)

const (
	// nodeRestartDelay is how long a cluster node that died stays down
	// before its supervisor starts it again: long enough to watch the
	// saga go on without it.
	nodeRestartDelay = 5 * time.Second
	// nodeStopTimeout bounds a node's graceful stop before it is killed.
	nodeStopTimeout = 10 * time.Second
	// clusterReadyTimeout bounds the wait for the cluster to take the
	// streams.
	clusterReadyTimeout = time.Minute
	// routePortOffset separates a node's route port from its client port,
	// as NATS's defaults do (4222, 6222).
	routePortOffset = 2000
)

// NATSNode is one node of the cluster Start runs with Config.ClusterNodes.
type NATSNode struct {
	Name string
	// URL is its client URL.
	URL string
	// PIDFile holds the process id of its current incarnation: kill it
	// (kill -9 "$(cat PIDFILE)") to watch the saga go on without it; it is
	// started again a few seconds later.
	PIDFile string

	args    []string // its command line
	logPath string
	logger  *slog.Logger

	mu       sync.Mutex
	proc     *os.Process // the current incarnation; nil while down
	stopping bool
	stopCh   chan struct{} // closed by stop
	done     chan struct{} // closed when the supervisor returns
}

// nodeConfig is a node's nats-server configuration.
const nodeConfig = `# Written by onceflow dev --cluster.
server_name: %s
listen: %s
pid_file: %q
jetstream {
  store_dir: %q
  %s
}
cluster {
  name: onceflow-dev
  listen: %s
  routes: [%s]
}
`

// startCluster starts cfg.ClusterNodes nats-server processes routed into
// one cluster and provisions the streams once it answers.
func (e *Env) startCluster(ctx context.Context, cfg Config, authConf string) error {
	if len(cfg.NATSNodeCommand) == 0 {
		return errors.New("a NATS cluster needs Config.NATSNodeCommand: the command that runs a nats-server")
	}
	dir, err := e.dir(cfg.DataDir, "nats")
	if err != nil {
		return err
	}
	clientPorts, routePorts, err := clusterPorts(cfg, &e.ports)
	if err != nil {
		return err
	}
	sync := ""
	if cfg.natsSyncAlways() {
		sync = "sync_interval: always"
	}
	var urls []string
	for i := range cfg.ClusterNodes {
		name := fmt.Sprintf("n%d", i+1)
		var routes []string
		for j, p := range routePorts {
			if j != i {
				routes = append(routes, "nats-route://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			}
		}
		node := &NATSNode{
			Name:    name,
			URL:     "nats://" + net.JoinHostPort(cfg.Host, strconv.Itoa(clientPorts[i])),
			PIDFile: filepath.Join(dir, name+".pid"),
			logPath: filepath.Join(dir, name+".log"),
			logger:  e.logger.With("component", "nats", "node", name),
		}
		confPath := filepath.Join(dir, name+".conf")
		conf := authConf + fmt.Sprintf(nodeConfig, name, net.JoinHostPort(cfg.Host, strconv.Itoa(clientPorts[i])), node.PIDFile,
			filepath.Join(dir, name), sync, net.JoinHostPort("127.0.0.1", strconv.Itoa(routePorts[i])), strings.Join(routes, ", "))
		if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", confPath, err)
		}
		node.args = append(append([]string(nil), cfg.NATSNodeCommand...), "-c", confPath)
		if err := node.start(); err != nil {
			return err
		}
		e.NATSNodes = append(e.NATSNodes, node)
		urls = append(urls, node.URL)
	}
	e.NATSURL = strings.Join(urls, ",")
	return nil
}

// clusterPorts returns the nodes' client and route ports: from
// cfg.Ports.NATS on (4222, 4223, …; routes 6222, …), or free ones from pool.
func clusterPorts(cfg Config, pool *freeport.Pool) (client, route []int, err error) {
	for i := range cfg.ClusterNodes {
		if cfg.Ports.NATS != 0 {
			client = append(client, cfg.Ports.NATS+i)
			route = append(route, cfg.Ports.NATS+routePortOffset+i)
			continue
		}
		c, err := pool.Take()
		if err != nil {
			return nil, nil, err
		}
		r, err := pool.Take()
		if err != nil {
			return nil, nil, err
		}
		client, route = append(client, c), append(route, r)
	}
	return client, route, nil
}

// start runs the node's first incarnation and its supervisor.
func (n *NATSNode) start() error {
	n.stopCh, n.done = make(chan struct{}), make(chan struct{})
	cmd, err := n.launch()
	if err != nil {
		return err
	}
	go n.supervise(cmd)
	return nil
}

// launch starts an incarnation of the node, its output appended to its
// log, unless the node is stopping: then it returns nil and no error.
func (n *NATSNode) launch() (*exec.Cmd, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopping {
		return nil, nil
	}
	logFile, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("nats node %s: open log: %w", n.Name, err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(n.args[0], n.args[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: a terminal's Ctrl-C reaches dev alone,
		// which stops the services before the nodes.
		Setpgid: true,
		// Die with dev.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("nats node %s: %w", n.Name, err)
	}
	n.proc = cmd.Process
	return cmd, nil
}

// supervise waits for each incarnation to exit and, unless the node is
// stopping, starts the next one after nodeRestartDelay: a node killed by
// hand comes back, as under a process manager.
func (n *NATSNode) supervise(cmd *exec.Cmd) {
	defer close(n.done)
	for {
		err := cmd.Wait()
		n.mu.Lock()
		n.proc = nil
		stopping := n.stopping
		n.mu.Unlock()
		if stopping {
			return
		}
		n.logger.Warn("nats node exited; starting it again", "status", err, "in", nodeRestartDelay)
		select {
		case <-n.stopCh:
			return
		case <-time.After(nodeRestartDelay):
		}
		if cmd, err = n.launch(); err != nil || cmd == nil {
			if err != nil {
				n.logger.Error("nats node not started again", "err", err)
			}
			return
		}
		n.logger.Info("nats node started again")
	}
}

// stop shuts the node down gracefully (SIGTERM), killing it after
// nodeStopTimeout, and ends its supervisor.
func (n *NATSNode) stop() {
	n.mu.Lock()
	n.stopping = true
	p := n.proc
	n.mu.Unlock()
	close(n.stopCh)
	if p != nil {
		_ = p.Signal(syscall.SIGTERM)
	}
	select {
	case <-n.done:
	case <-time.After(nodeStopTimeout):
		if p != nil {
			_ = p.Kill()
		}
		<-n.done
	}
}

// provision creates the streams and consumers as `onceflow provision`
// would, as the provisioner, with the stream settings of environ, before
// the services start, retrying until a cluster's nodes have found each
// other and elected a meta leader: creating R3 streams can outlast the
// JetStream API's time-out on a busy machine.
func provision(ctx context.Context, client natsauth.Client, environ map[string]string) error {
	cfg, err := env.ParseAsWithOptions[streams.Config](env.Options{Environment: environ})
	if err != nil {
		return fmt.Errorf("stream config: %w", err)
	}
	// The nodes may not listen yet.
	nc, err := nats.Connect(client.URL, append(client.Options(streams.Provisioner),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
	if err != nil {
		return fmt.Errorf("connect to the nats cluster: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, clusterReadyTimeout)
	defer cancel()
	for {
		// Each attempt bounded: a request made before the connection was
		// up waits for its context's end.
		attempt, cancelAttempt := context.WithTimeout(ctx, 10*time.Second)
		err := streams.Provision(attempt, js, streams.Saga(cfg))
		cancelAttempt()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("provision the streams on the nats cluster (its logs are beside the pid files): %w", err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
