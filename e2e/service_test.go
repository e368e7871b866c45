package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// service is one instance of a service, run as an OS process by a
// supervisor that starts it again, after a moment, when it dies — when the
// scenario allows restarts. The inbox counters it exports are scraped while
// it runs and summed over its incarnations.
type service struct {
	kind    string // order, payment, inventory or notify
	name    string // kind, or kind#2 for a second replica
	addr    string // its HTTP address, the same in every incarnation
	bin     string
	env     []string
	logPath string
	restart bool

	mu   sync.Mutex
	proc *process // the current incarnation; nil while down
	// killed is set when the harness killed the current incarnation.
	killed   bool
	stopping bool
	// Counters of incarnations that ended, and the last scrape of the
	// current one.
	pastMetrics metrics
	metrics     metrics
	selfKills   int // SIGKILLs the harness did not send: the fault hook
	unexpected  []string
	done        chan struct{} // closed when the supervisor returns
}

func (s *service) url() string { return "http://" + s.addr }

// start runs the first incarnation, waits until it is ready, and hands it
// to the supervisor.
func (s *service) start(ctx context.Context) error {
	p, err := s.launch()
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("start %s: stopping", s.name)
	}
	if err := s.waitReady(ctx, p); err != nil {
		p.signal(syscall.SIGKILL)
		<-p.done
		return err
	}
	s.done = make(chan struct{})
	go s.supervise(p)
	return nil
}

// launch starts an incarnation, unless the service is stopping: then it
// returns nil and no error. The lock is held throughout, so that stop
// cannot miss an incarnation starting.
func (s *service) launch() (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil, nil
	}
	p, err := startProcess(s.bin, []string{s.kind}, s.env, s.logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", s.name, err)
	}
	s.proc, s.killed, s.metrics = p, false, nil
	return p, nil
}

// waitReady polls /readyz until it answers 200 or the process exits.
func (s *service) waitReady(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var last error
	for {
		if last = probe(ctx, s.url()+"/readyz"); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during start-up (%v); log %s:\n%s", s.name, p.err, s.logPath, tailFile(s.logPath, 30))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last: %v); log %s:\n%s", s.name, ctx.Err(), last, s.logPath, tailFile(s.logPath, 30))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// supervise waits for each incarnation to exit and, unless the service is
// stopping or restarts are off, starts the next one after a moment.
func (s *service) supervise(p *process) {
	defer close(s.done)
	for {
		<-p.done
		s.mu.Lock()
		s.pastMetrics = s.pastMetrics.plus(s.metrics)
		s.metrics, s.proc = nil, nil
		stopping, killed := s.stopping, s.killed
		switch {
		case stopping || killed:
		case s.restart && p.killedBySignal(syscall.SIGKILL):
			// Only the fault hook kills a service that way, and only where
			// the scenario restarts it.
			s.selfKills++
		default:
			s.unexpected = append(s.unexpected, fmt.Sprintf("%s exited unexpectedly: %v", s.name, p.err))
		}
		restart := s.restart && !stopping
		s.mu.Unlock()
		if !restart {
			return
		}
		// A moment down, as a supervisor's restart back-off would leave it.
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		next, err := s.launch()
		if err != nil {
			s.mu.Lock()
			s.unexpected = append(s.unexpected, err.Error())
			s.mu.Unlock()
			return
		}
		if next == nil {
			return
		}
		p = next
	}
}

// kill kills the current incarnation with SIGKILL, after a last scrape of
// its counters, and reports whether one was running.
func (s *service) kill(ctx context.Context) bool {
	s.scrape(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.killed {
		return false
	}
	s.killed = true
	s.proc.signal(syscall.SIGKILL)
	return true
}

// signal sends sig to the current incarnation, if one runs.
func (s *service) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.signal(sig)
	}
}

// running reports whether an incarnation is up.
func (s *service) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.killed
}

// stop shuts the service down gracefully (SIGTERM: stop fetching, finish,
// flush the outbox) and reports an error if it did not exit cleanly in
// time.
func (s *service) stop() error {
	s.mu.Lock()
	s.stopping = true
	p := s.proc
	s.mu.Unlock()
	var err error
	if p != nil {
		s.scrape(context.Background())
		if !p.stop(30 * time.Second) {
			err = fmt.Errorf("%s did not stop within 30s of SIGTERM and was killed", s.name)
		} else if p.err != nil && !p.killedBySignal(syscall.SIGKILL) {
			err = fmt.Errorf("%s stopped with %v", s.name, p.err)
		}
	}
	if s.done != nil {
		<-s.done
	}
	return err
}

// restartAfter stops the service gracefully (SIGTERM), runs down while no
// incarnation runs, and starts it again. It returns when the new
// incarnation answers /readyz: when it was launched, and that moment.
func (s *service) restartAfter(ctx context.Context, down func(context.Context) error) (launched, ready time.Time, err error) {
	s.scrape(ctx)
	s.mu.Lock()
	s.stopping = true // the supervisor does not start the next incarnation
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		if !p.stop(30 * time.Second) {
			return time.Time{}, time.Time{}, fmt.Errorf("%s did not stop within 30s of SIGTERM and was killed", s.name)
		}
		if p.err != nil {
			return time.Time{}, time.Time{}, fmt.Errorf("%s stopped with %v", s.name, p.err)
		}
	}
	<-s.done
	if err := down(ctx); err != nil {
		return time.Time{}, time.Time{}, err
	}
	s.mu.Lock()
	s.stopping = false
	s.mu.Unlock()
	launched = time.Now()
	if err := s.start(ctx); err != nil {
		return time.Time{}, time.Time{}, err
	}
	return launched, time.Now(), nil
}

// problems are the unexpected exits so far.
func (s *service) problems() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.unexpected...)
}

// counters returns the inbox counters summed over the incarnations.
func (s *service) counters() metrics {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pastMetrics.plus(s.metrics)
}

// scrape reads the current incarnation's /metrics. A failed scrape keeps
// the previous one: a killed incarnation's last moments go uncounted, so
// the summed counters are lower bounds.
func (s *service) scrape(ctx context.Context) {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil {
		return
	}
	m, err := fetchMetrics(ctx, s.url()+"/metrics")
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == p { // not a scrape of the next incarnation
		s.metrics = m
	}
}

// metricKey is a consumer and an outcome of onceflow_inbox_messages_total.
type metricKey struct{ consumer, outcome string }

// metrics are the onceflow_inbox_messages_total counters of a process,
// summed over event types. A series appears only once incremented, so a
// missing key reads as 0.
type metrics map[metricKey]float64

func (m metrics) plus(o metrics) metrics {
	sum := make(metrics, len(m)+len(o))
	for k, v := range m {
		sum[k] += v
	}
	for k, v := range o {
		sum[k] += v
	}
	return sum
}

// total sums the series of outcome, over every consumer.
func (m metrics) total(outcome string) int64 {
	var n float64
	for k, v := range m {
		if k.outcome == outcome {
			n += v
		}
	}
	return int64(n)
}

func fetchMetrics(ctx context.Context, url string) (metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the onceflow_inbox_messages_total series of a
// Prometheus text exposition, summed over event types.
func parseMetrics(r io.Reader) (metrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	m := metrics{}
	for _, series := range families["onceflow_inbox_messages_total"].GetMetric() {
		var k metricKey
		for _, l := range series.GetLabel() {
			switch l.GetName() {
			case "consumer":
				k.consumer = l.GetValue()
			case "outcome":
				k.outcome = l.GetValue()
			}
		}
		m[k] += series.GetCounter().GetValue()
	}
	return m, nil
}
