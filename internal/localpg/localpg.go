package localpg

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/freeport"
)

// ErrNotInstalled reports that no PostgreSQL binaries were found.
var ErrNotInstalled = errors.New("no PostgreSQL binaries (initdb, postgres)")

const (
	defaultMaxConnections = 300
	// readyTimeout bounds start-up; recoveryTimeout bounds it while the
	// server answers that it is starting up: crash recovery replays the
	// WAL since the last checkpoint, which on a busy machine can take
	// longer, and a server killed for being slow would only start over.
	readyTimeout    = 60 * time.Second
	recoveryTimeout = 5 * time.Minute
	// stopTimeout bounds a fast shutdown before the server is killed.
	stopTimeout = 30 * time.Second
)

// Config configures a cluster. The zero value is a fast, non-durable cluster
// in a new temporary directory on a free port.
type Config struct {
	// Dir holds the cluster: the data directory "data", the socket directory
	// "run" and the server log "server.log". A cluster already in Dir is
	// reused. Empty means a new temporary directory, removed by Stop.
	Dir string
	// BinDir holds initdb and postgres. Empty means the directory of initdb
	// on PATH (symlinks resolved), else the newest /usr/lib/postgresql/*/bin.
	BinDir string
	// Port is the TCP port on 127.0.0.1. Zero picks a free one (package
	// freeport), and another if that one is taken before the server binds it.
	Port int
	// Durable keeps PostgreSQL's crash-safety defaults. When false, fsync,
	// synchronous_commit and full_page_writes are off: fast, and lost on an
	// operating-system crash.
	Durable bool
	// MaxConnections is the server's max_connections; zero means 300.
	MaxConnections int
}

// Cluster is a PostgreSQL server started by Start. Its methods are safe for
// concurrent use.
type Cluster struct {
	logger    *slog.Logger
	binDir    string
	dir       string
	removeDir bool
	logPath   string
	port      int
	args      []string            // of the postgres binary
	cred      *syscall.Credential // nil unless running as root
	ports     *freeport.Pool      // reserves port; nil if none was picked

	mu      sync.Mutex
	proc    *process // nil while the server is down
	stopped bool
}

// process is one run of the postgres binary.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // exit status; read only after done is closed
}

// Start initialises a cluster (unless Dir already holds one) and starts its
// server, returning once the server accepts connections. The caller must
// call Stop.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (*Cluster, error) {
	// A port from freeport, rather than one the kernel picks, stays free
	// while Restart stops and starts the server on it; the Pool's
	// reservation keeps it so until Stop.
	ports := &freeport.Pool{}
	c, err := startWith(ctx, cfg, logger, ports.Take)
	if err != nil {
		return nil, errors.Join(err, ports.Close())
	}
	c.ports = ports
	return c, nil
}

// startWith is Start, with the ports it tries when cfg.Port is zero picked
// by pickPort.
func startWith(ctx context.Context, cfg Config, logger *slog.Logger, pickPort func() (int, error)) (*Cluster, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	binDir, err := FindBinDir(cfg.BinDir)
	if err != nil {
		return nil, err
	}
	cred, err := ServerCredential()
	if err != nil {
		return nil, err
	}
	port := cfg.Port
	if port == 0 {
		if port, err = pickPort(); err != nil {
			return nil, err
		}
	}

	dir, removeDir := cfg.Dir, false
	if dir == "" {
		removeAbandoned(os.TempDir(), logger)
		if dir, err = os.MkdirTemp("", tempDirPrefix); err != nil {
			return nil, fmt.Errorf("create cluster directory: %w", err)
		}
		removeDir = true
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
			return nil, errors.Join(fmt.Errorf("record the cluster directory's owner: %w", err), os.RemoveAll(dir))
		}
	}
	c := &Cluster{
		logger:    logger,
		binDir:    binDir,
		dir:       dir,
		removeDir: removeDir,
		logPath:   filepath.Join(dir, "server.log"),
		port:      port,
		cred:      cred,
	}
	c.args = c.serverArgs(cfg)

	if err := c.initDir(ctx, cfg.Durable); err != nil {
		return nil, errors.Join(err, c.cleanup())
	}
	for attempt := 1; ; attempt++ {
		err := c.start(ctx)
		if err == nil {
			return c, nil
		}
		// A port picked free can still be taken before the server binds it,
		// by another process picking by number (go test runs packages'
		// binaries side by side, each with its own pool).
		if cfg.Port != 0 || !errors.Is(err, errPortTaken) || attempt == maxPortAttempts {
			return nil, errors.Join(err, c.cleanup())
		}
		if c.port, err = pickPort(); err != nil {
			return nil, errors.Join(err, c.cleanup())
		}
		c.args = c.serverArgs(cfg)
	}
}

// maxPortAttempts bounds the ports Start tries when it picks them.
const maxPortAttempts = 5

// errPortTaken is the failure of a server whose port was in use.
var errPortTaken = errors.New("port in use")

// URL is the connection URL of database as the superuser "postgres".
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(database))
}

// Restart stops the server and starts it again on the same data directory
// and port, as a database outage would: every connection is broken. It
// returns once the server accepts connections again.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("restart postgres: cluster stopped")
	}
	if err := c.stopServer(ctx); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	if err := c.start(ctx); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	return nil
}

// Stop shuts the server down (a fast shutdown: open transactions are rolled
// back), killing it if it has not exited when ctx ends or after 30 seconds,
// and removes the cluster directory if Start created it. Calling Stop again
// does nothing.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	return errors.Join(c.stopServer(ctx), c.cleanup())
}

func (c *Cluster) serverArgs(cfg Config) []string {
	args := []string{
		"-D", c.dataDir(),
		"-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + c.socketDir(),
		"-c", "max_connections=" + strconv.Itoa(cmp.Or(cfg.MaxConnections, defaultMaxConnections)),
		// Log to stderr, which goes to server.log.
		"-c", "logging_collector=off",
		// A local cluster starts empty. A prepared statement keeps the
		// plan made while its table was tiny (a sequential scan) until the
		// table is analyzed, which by default waits up to a minute: most
		// of a short benchmark, at millions of rows read per second. Not
		// 1s: vacuuming the busy tables that often cost a fifth of the
		// throughput.
		"-c", "autovacuum_naptime=10s",
	}
	if !cfg.Durable {
		args = append(args,
			"-c", "fsync=off",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
		)
	}
	return args
}

func (c *Cluster) dataDir() string   { return filepath.Join(c.dir, "data") }
func (c *Cluster) socketDir() string { return filepath.Join(c.dir, "run") }

// initDir creates the directories and runs initdb unless the data directory
// already holds a cluster.
func (c *Cluster) initDir(ctx context.Context, durable bool) error {
	var created []string
	if c.removeDir {
		created = append(created, c.dir)
	}
	for _, dir := range []string{c.dataDir(), c.socketDir()} {
		if _, err := os.Stat(dir); err == nil {
			continue
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		created = append(created, dir)
	}
	if c.cred != nil {
		for _, dir := range created {
			if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return fmt.Errorf("hand %s to the postgres user: %w", dir, err)
			}
		}
	}

	if _, err := os.Stat(filepath.Join(c.dataDir(), "PG_VERSION")); err == nil {
		c.logger.InfoContext(ctx, "reusing postgres cluster", "dir", c.dataDir())
		return nil
	}
	args := []string{
		"-D", c.dataDir(),
		"--username=postgres",
		"--auth=trust",
		"--encoding=UTF8",
		"--locale=C",
	}
	if !durable {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "initdb"), args...)
	cmd.Dir = c.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", c.dataDir(), err, tail(out))
	}
	return nil
}

// start runs the server and waits until it accepts connections. The caller
// holds c.mu (or has not shared c yet).
func (c *Cluster) start(ctx context.Context) error {
	logFile, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}
	defer logFile.Close() // the child has its own descriptor
	// This run's lines follow what earlier runs wrote.
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}

	// Not CommandContext: the server outlives the start-up context.
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), c.args...)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: a terminal's SIGINT reaches only us. (Its
		// backends each start a session of their own: see reapOrphans.)
		Setpgid: true,
		// Die with the parent. The kernel sends it when the thread that
		// started the child exits; Go does not end threads on its own.
		Pdeathsig:  syscall.SIGKILL,
		Credential: c.cred,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	if err := c.waitReady(ctx, p, logStart); err != nil {
		p.kill()
		<-p.done
		return err
	}
	c.proc = p
	c.logger.InfoContext(ctx, "postgres started", "url", c.URL("postgres"), "pid", cmd.Process.Pid, "dir", c.dir)
	return nil
}

// waitReady polls until the server accepts a connection, exits, or the
// start-up time is up. The server's lines of this run start at logStart in
// its log.
func (c *Cluster) waitReady(ctx context.Context, p *process, logStart int64) error {
	ctx, cancel := context.WithTimeout(ctx, recoveryTimeout)
	defer cancel()
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	// A server that answers it is starting up has readyTimeout from its
	// last such answer, up to recoveryTimeout in all.
	deadline := time.Now().Add(readyTimeout)
	for {
		err := ping(ctx, c.URL("postgres"))
		if err == nil {
			return nil
		}
		if starting(err) {
			deadline = time.Now().Add(readyTimeout)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres not accepting connections on port %d after %s (last attempt: %v); server log %s:\n%s",
				c.port, readyTimeout, err, c.logPath, c.logTail())
		}
		select {
		case <-p.done:
			err := fmt.Errorf("postgres exited during start-up (%v); server log %s:\n%s", p.err, c.logPath, c.logTail())
			if c.portTaken(logStart) {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("postgres not accepting connections on port %d: %w (last attempt: %v); server log %s:\n%s",
				c.port, ctx.Err(), err, c.logPath, c.logTail())
		case <-ticker.C:
		}
	}
}

// starting reports whether err is a server's answer that it is starting
// up (or recovering): it is alive and getting there.
func starting(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57P03" // cannot_connect_now
}

func ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// stopServer shuts the server down if it runs. The caller holds c.mu.
func (c *Cluster) stopServer(ctx context.Context) error {
	p := c.proc
	if p == nil {
		return nil
	}
	c.proc = nil
	select {
	case <-p.done:
		c.logger.WarnContext(ctx, "postgres had exited", "status", p.err, "log", c.logPath)
		return nil
	default:
	}

	// SIGINT is PostgreSQL's fast shutdown.
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal postgres: %w", err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("postgres shutdown: %w; server log %s:\n%s", p.err, c.logPath, c.logTail())
		}
		c.logger.InfoContext(ctx, "postgres stopped", "port", c.port)
		return nil
	case <-timer.C:
	case <-ctx.Done():
	}
	p.kill()
	<-p.done
	// Its backends are not in its process group: gone before a restart
	// (bounded by reapOrphans whatever ctx says).
	reapErr := reapOrphans(context.WithoutCancel(ctx), c.dataDir())
	return errors.Join(fmt.Errorf("postgres did not shut down in time and was killed; server log %s:\n%s", c.logPath, c.logTail()), reapErr)
}

const (
	// tempDirPrefix begins the name of a temporary cluster's directory.
	tempDirPrefix = "onceflow-pg-"
	// ownerFile, in a temporary cluster's directory, holds the process id
	// of the process that created it, which removes it at Stop.
	ownerFile = "owner.pid"
)

// removeAbandoned removes the temporary cluster directories in tmp whose
// owner is gone: a test binary that panicked or an `onceflow dev` killed
// with SIGKILL takes its server with it, but leaves its directory behind,
// which nothing else would remove. A directory whose owner file is missing
// (being created, or made before owners were recorded) or names a live
// process is left alone; so is one whose owner cannot be told, even if its
// process id was reused since.
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
		if err := os.RemoveAll(dir); err != nil {
			logger.Warn("remove an abandoned postgres cluster directory", "dir", dir, "err", err)
			continue
		}
		logger.Info("removed an abandoned postgres cluster directory", "dir", dir, "owner_pid", pid)
	}
}

// cleanup gives up the port's reservation and removes the cluster directory
// if Start created it.
func (c *Cluster) cleanup() error {
	var errs []error
	if c.ports != nil {
		errs = append(errs, c.ports.Close())
	}
	if c.removeDir {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove cluster directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

// kill kills the postmaster's process group; its backends, each in a
// session of its own, see it gone and exit (reapOrphans waits for them).
func (p *process) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// portTaken tells whether the server's log, from logStart on, says that
// its port was in use.
func (c *Cluster) portTaken(logStart int64) bool {
	b, err := os.ReadFile(c.logPath)
	return err == nil && int64(len(b)) >= logStart && bytes.Contains(b[logStart:], []byte("Address already in use"))
}

// logTail is the end of the server log, for error messages.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return fmt.Sprintf("(server log unreadable: %v)", err)
	}
	return tail(b)
}

// tail returns the last lines of out, at most about 4 KiB.
func tail(out []byte) string {
	const maxLines, maxBytes = 30, 4096
	out = bytes.TrimRight(out, "\n")
	if len(out) > maxBytes {
		out = out[len(out)-maxBytes:]
	}
	lines := bytes.Split(out, []byte("\n"))
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// FindBinDir returns the directory holding initdb and postgres: dir, or
// when dir is empty the one Config.BinDir defaults to.
func FindBinDir(dir string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = defaultBinDir(); err != nil {
			return "", err
		}
	}
	for _, name := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("%w: %w", ErrNotInstalled, err)
		}
	}
	return dir, nil
}

func defaultBinDir() (string, error) {
	if path, err := exec.LookPath("initdb"); err == nil {
		// Distributions link initdb into PATH; the server binary sits next
		// to the real file, of the same version.
		if real, err := filepath.EvalSymlinks(path); err == nil {
			path = real
		}
		return filepath.Dir(path), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	best, bestVersion := "", -1
	for _, m := range matches {
		bin := filepath.Dir(m)
		version, err := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
		if err == nil && version > bestVersion {
			best, bestVersion = bin, version
		}
	}
	if best == "" {
		return "", fmt.Errorf("%w: initdb is not on PATH and /usr/lib/postgresql/*/bin holds none; install PostgreSQL or set Config.BinDir", ErrNotInstalled)
	}
	return best, nil
}

// ServerCredential is who runs initdb and postgres: the caller, unless the
// caller is root, which PostgreSQL refuses; then the "postgres" OS user.
func ServerCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs an unprivileged OS user \"postgres\": %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("uid of user postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("gid of user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
