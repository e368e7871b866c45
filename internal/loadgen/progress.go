package loadgen

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// progress writes a progress line until ctx ends, and a last one then: in
// place on a terminal, else every few seconds.
func (r *run) progress(ctx context.Context, start time.Time, placingDone <-chan struct{}) {
	every := 5 * time.Second
	if r.cfg.TTY {
		every = 250 * time.Millisecond
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			line := r.progressLine(start, placingDone)
			if r.cfg.TTY {
				line = "\r" + line + "\x1b[K"
			}
			fmt.Fprintln(r.cfg.Progress, line)
			return
		case <-ticker.C:
		}
		line := r.progressLine(start, placingDone)
		if r.cfg.TTY {
			fmt.Fprintf(r.cfg.Progress, "\r%s\x1b[K", line)
		} else {
			fmt.Fprintln(r.cfg.Progress, line)
		}
	}
}

const barWidth = 24

func (r *run) progressLine(start time.Time, placingDone <-chan struct{}) string {
	elapsed := time.Since(start)
	frac := min(elapsed.Seconds()/r.cfg.Duration.Seconds(), 1)
	phase := "placing"
	select {
	case <-placingDone:
		phase, frac = "settling", 1
	default:
	}
	filled := int(frac * barWidth)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", barWidth-filled)
	placed, pending := r.tracker.counts()
	return fmt.Sprintf("[%s] %s %5.1fs/%s  placed %d (%.0f/s)  finished %d  in flight %d  errors %d",
		bar, phase, elapsed.Seconds(), r.cfg.Duration, placed, float64(placed)/max(elapsed.Seconds(), 1e-3),
		placed-pending, pending, r.placeErrors.Load())
}
