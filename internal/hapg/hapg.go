package hapg

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/internal/freeport"
	"github.com/onceflow/onceflow/internal/localpg"
)

// ErrNotInstalled reports that patroni or etcd is missing.
var ErrNotInstalled = errors.New("patroni and etcd are needed (Debian: apt-get install patroni etcd-server)")

const (
	// readyTimeout bounds Start and each fault's wait for a primary.
	readyTimeout = 90 * time.Second
	// stopTimeout bounds each process's graceful stop before it is killed.
	stopTimeout = 30 * time.Second
	// nodes is the cluster's size: a primary and its standby.
	nodes = 2
)

// Config configures a cluster. The zero value is two PostgreSQL nodes
// with a synchronous standby.
type Config struct {
	// BinDir holds PostgreSQL's binaries; empty means localpg's default
	// (initdb's directory on PATH, else the newest /usr/lib/postgresql/*/bin).
	BinDir string
	// Async turns Patroni's synchronous_mode off: the standby replicates
	// asynchronously, PostgreSQL's default, and a failover may lose the
	// transactions it had not received.
	Async bool
	// MaxConnections is each node's max_connections; zero means 200.
	MaxConnections int
}

// Cluster is a running Patroni cluster. Its methods are safe for concurrent
// use.
type Cluster struct {
	logger  *slog.Logger
	cfg     Config
	dir     string
	cred    *syscall.Credential
	ports   *freeport.Pool
	etcd    *process
	etcdURL string
	nodes   [nodes]*node
	// http asks Patroni and etcd, with no connection kept idle (and no
	// goroutine left to a leak check).
	http *http.Client

	mu      sync.Mutex // serialises faults and Stop
	stopped bool
}

// node is one Patroni member and its PostgreSQL server.
type node struct {
	name    string
	dir     string
	pgPort  int
	apiPort int
	proxy   *proxy   // in front of pgPort, for the other node's replication
	patroni *process // nil once killed
}

func (n *node) dataDir() string { return filepath.Join(n.dir, "data") }
func (n *node) apiURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", n.apiPort, path)
}

// Start starts etcd and both Patroni nodes and returns once the cluster
// replicates as configured. The caller must call Stop, also on an error of
// a later call.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (*Cluster, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	for _, bin := range []string{"patroni", "etcd"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotInstalled, err)
		}
	}
	binDir, err := localpg.FindBinDir(cfg.BinDir)
	if err != nil {
		return nil, fmt.Errorf("hapg: postgres binaries: %w", err)
	}
	cfg.BinDir = binDir
	cred, err := localpg.ServerCredential()
	if err != nil {
		return nil, err
	}
	removeAbandoned(os.TempDir(), logger)
	dir, err := os.MkdirTemp("", tempDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("hapg: create the cluster directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, errors.Join(fmt.Errorf("hapg: record the cluster directory's owner: %w", err), os.RemoveAll(dir))
	}
	c := &Cluster{
		logger: logger, cfg: cfg, dir: dir, cred: cred, ports: &freeport.Pool{},
		http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
	}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Stop(context.WithoutCancel(ctx)))
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	ports := make([]int, 2+2*nodes)
	for i := range ports {
		port, err := c.ports.Take()
		if err != nil {
			return err
		}
		ports[i] = port
	}
	if err := c.mkdir(c.dir); err != nil {
		return err
	}
	if err := c.startEtcd(ctx, ports[0], ports[1]); err != nil {
		return err
	}
	scope := "onceflow-" + filepath.Base(c.dir)
	for i := range c.nodes {
		n := &node{
			name:    "node" + strconv.Itoa(i),
			dir:     filepath.Join(c.dir, "node"+strconv.Itoa(i)),
			pgPort:  ports[2+2*i],
			apiPort: ports[3+2*i],
		}
		c.nodes[i] = n
		var err error
		if n.proxy, err = startProxy(fmt.Sprintf("127.0.0.1:%d", n.pgPort)); err != nil {
			return err
		}
		if err := c.startNode(ctx, n, scope); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	primary, err := c.awaitReplicating(ctx, -1)
	if err != nil {
		return err
	}
	c.logger.InfoContext(ctx, "patroni cluster started", "primary", c.nodes[primary].name, "async", c.cfg.Async,
		"url", c.URL("postgres"), "dir", c.dir)
	return nil
}

// mkdir creates dir for the PostgreSQL user.
func (c *Cluster) mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("hapg: hand %s to the postgres user: %w", dir, err)
		}
	}
	return nil
}

func (c *Cluster) startEtcd(ctx context.Context, clientPort, peerPort int) error {
	dir := filepath.Join(c.dir, "etcd")
	if err := c.mkdir(dir); err != nil {
		return err
	}
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	var err error
	c.etcd, err = c.run(filepath.Join(c.dir, "etcd.log"), "etcd",
		"--name", "etcd0", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", c.etcdURL, "--advertise-client-urls", c.etcdURL,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "etcd0="+peer, "--initial-cluster-state", "new")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	return await(ctx, c.etcd, "etcd healthy", func(ctx context.Context) (bool, error) {
		body, status, err := c.get(ctx, c.etcdURL+"/health")
		return err == nil && status == 200 && strings.Contains(body, `"true"`), err
	})
}

func (c *Cluster) startNode(ctx context.Context, n *node, scope string) error {
	if err := c.mkdir(n.dir); err != nil {
		return err
	}
	if err := c.mkdir(filepath.Join(n.dir, "run")); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c.patroniConfig(n, scope), "", "  ")
	if err != nil {
		return fmt.Errorf("hapg: patroni configuration: %w", err)
	}
	// JSON is YAML: Patroni reads it as its configuration file.
	path := filepath.Join(n.dir, "patroni.yml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("hapg: %w", err)
	}
	n.patroni, err = c.run(filepath.Join(n.dir, "patroni.log"), "patroni", path)
	if err != nil {
		return err
	}
	c.logger.DebugContext(ctx, "patroni node started", "node", n.name, "port", n.pgPort, "api", n.apiPort)
	return nil
}

// patroniConfig is node n's Patroni configuration. Timings are short so
// that a failover takes seconds: a dead node's leader key expires after
// ttl, Patroni checks every loop_wait.
func (c *Cluster) patroniConfig(n *node, scope string) map[string]any {
	pgAddr := fmt.Sprintf("127.0.0.1:%d", n.pgPort)
	apiAddr := fmt.Sprintf("127.0.0.1:%d", n.apiPort)
	superuser := map[string]string{"username": "postgres", "password": "postgres"}
	return map[string]any{
		"scope":   scope,
		"name":    n.name,
		"restapi": map[string]any{"listen": apiAddr, "connect_address": apiAddr},
		"etcd3":   map[string]any{"hosts": []string{strings.TrimPrefix(c.etcdURL, "http://")}},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl": 6, "loop_wait": 1, "retry_timeout": 2,
				"maximum_lag_on_failover": 16 << 20,
				// A crashed primary fails over rather than restart.
				"primary_start_timeout": 0,
				"synchronous_mode":      !c.cfg.Async,
				"postgresql": map[string]any{
					"use_slots": true,
					"parameters": map[string]any{
						"wal_level": "replica", "hot_standby": "on", "wal_log_hints": "on",
						"max_wal_senders": 10, "max_replication_slots": 10,
						"max_connections": cmp.Or(c.cfg.MaxConnections, 200),
					},
				},
			},
			"initdb": []any{map[string]string{"encoding": "UTF8"}, map[string]string{"locale": "C"},
				map[string]string{"auth": "trust"}, "no-sync"},
		},
		"postgresql": map[string]any{
			"listen": pgAddr,
			// The other node replicates through the proxy, which
			// HoldReplication can stop.
			"connect_address": n.proxy.addr(),
			"data_dir":        n.dataDir(),
			"bin_dir":         c.cfg.BinDir,
			"pgpass":          filepath.Join(n.dir, "pgpass"),
			"authentication":  map[string]any{"superuser": superuser, "replication": superuser},
			"parameters": map[string]any{
				"unix_socket_directories": filepath.Join(n.dir, "run"),
				// Test data: a node is killed, never its machine.
				"fsync": "off",
			},
			"pg_hba": []string{
				"local all all trust",
				"host all all 127.0.0.1/32 trust",
				"host replication all 127.0.0.1/32 trust",
			},
		},
	}
}

// URL connects to database on whichever node is the primary: pgx tries
// the hosts in order and keeps the first that accepts writes.
func (c *Cluster) URL(database string) string {
	hosts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.pgPort)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write",
		strings.Join(hosts, ","), url.PathEscape(database))
}

// NodeURL connects to database on node i, primary or standby.
func (c *Cluster) NodeURL(i int, database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.nodes[i].pgPort, url.PathEscape(database))
}

// Stop stops both nodes and etcd, kills what does not stop, and removes the
// cluster's directory. Calling it again does nothing.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	var errs []error
	// The standby first: a primary's shutdown waits for its standbys to
	// receive the last WAL, and a held proxy never delivers it.
	primary, _ := c.primary(ctx)
	for i := range c.nodes {
		if n := c.nodes[(primary+1+i)%nodes]; n != nil {
			errs = append(errs, c.stopNode(ctx, n))
		}
	}
	if c.etcd != nil {
		errs = append(errs, c.etcd.stop(ctx))
	}
	errs = append(errs, c.ports.Close(), os.RemoveAll(c.dir))
	return errors.Join(errs...)
}

// stopNode stops n's Patroni, which stops its PostgreSQL, and then reaps
// any PostgreSQL process left in n's data directory.
func (c *Cluster) stopNode(ctx context.Context, n *node) error {
	var errs []error
	if n.patroni != nil {
		errs = append(errs, n.patroni.stop(ctx))
		n.patroni = nil
	}
	if _, err := os.Stat(n.dataDir()); err == nil {
		errs = append(errs, localpg.ReapProcesses(context.WithoutCancel(ctx), n.dataDir()))
	}
	if n.proxy != nil {
		n.proxy.close()
	}
	return errors.Join(errs...)
}

// await polls cond until it holds, p exits, or ctx ends.
func await(ctx context.Context, p *process, what string, cond func(context.Context) (bool, error)) error {
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		last = cmp.Or(err, last)
		select {
		case <-ctx.Done():
			return fmt.Errorf("hapg: await %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-p.exited():
			return fmt.Errorf("hapg: await %s: %s exited: %v; its log:\n%s", what, p.name, p.err, p.logTail())
		case <-ticker.C:
		}
	}
}

// Dir is the cluster's directory: etcd's and each node's data and logs.
func (c *Cluster) Dir() string { return c.dir }

const (
	// tempDirPrefix begins the name of a cluster's directory.
	tempDirPrefix = "onceflow-hapg-"
	// ownerFile, in a cluster's directory, holds the process id of the
	// process that started the cluster.
	ownerFile = "owner.pid"
)

// removeAbandoned stops the servers of the clusters in tmp whose owner is
// gone, and removes their directories. A test binary that dies takes etcd
// and Patroni with it (their parent-death signal), but not the postmasters
// Patroni started, each in a session of its own.
func removeAbandoned(tmp string, logger *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, tempDirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid <= 0 || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		data, _ := filepath.Glob(filepath.Join(dir, "node*", "data"))
		for _, d := range data {
			if err := localpg.ReapProcesses(context.Background(), d); err != nil {
				logger.Warn("stop an abandoned patroni node", "dir", d, "err", err)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			logger.Warn("remove an abandoned patroni cluster directory", "dir", dir, "err", err)
			continue
		}
		logger.Info("removed an abandoned patroni cluster", "dir", dir, "owner_pid", pid)
	}
}
