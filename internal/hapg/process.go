package hapg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is etcd or a Patroni node, run as the PostgreSQL user.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	err     error         // exit status; read only after done is closed
}

// run starts name with args, its output appended to logPath.
func (c *Cluster) run(logPath, name string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("hapg: open %s's log: %w", name, err)
	}
	defer logFile.Close() // the child has its own descriptor
	// Not CommandContext: the process outlives the start-up context.
	cmd := exec.Command(name, args...)
	cmd.Dir = c.dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "HOME=" + c.dir}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group, killed as one; dead with this process.
		// (Patroni's postmaster escapes both: it runs in a session of its
		// own, which stopNode reaps.)
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
		Credential: c.cred,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("hapg: start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() <-chan struct{} { return p.done }

// kill kills the process group with SIGKILL and waits for it.
func (p *process) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// stop asks the process to exit (SIGTERM: Patroni stops its PostgreSQL
// first) and kills it if it has not after stopTimeout or when ctx ends.
func (p *process) stop(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("hapg: signal %s: %w", p.name, err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	case <-ctx.Done():
	}
	p.kill()
	return fmt.Errorf("hapg: %s did not stop in time and was killed; its log %s:\n%s", p.name, p.logPath, p.logTail())
}

// logTail is the end of the process's log, for error messages.
func (p *process) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	const maxBytes = 4096
	b = bytes.TrimRight(b, "\n")
	if len(b) > maxBytes {
		b = b[len(b)-maxBytes:]
	}
	return string(b)
}
