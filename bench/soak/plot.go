package main

import (
	"fmt"
	"strings"
)

// plot draws two panels, the tables' size and the p99 over the run, each
// with a line per variant, as loadgen draws its histogram: plain SVG.
func plot(old, part []sample) string {
	const w, h, panelH, left, top = 760, 560, 220, 70, 40
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	b.WriteString(`<text x="70" y="20" font-size="14">Soak: row-deleting cleaners (red) against partitions (blue)</text>` + "\n")
	panel(&b, "inbox + outbox size, MB", left, top, w-left-30, panelH, old, part, func(s sample) float64 { return s.Size })
	panel(&b, "placed→confirmed p99, ms", left, top+panelH+60, w-left-30, panelH, old, part, func(s sample) float64 { return s.P99 })
	b.WriteString("</svg>\n")
	return b.String()
}

func panel(b *strings.Builder, title string, x, y, pw, ph int, old, part []sample, f func(sample) float64) {
	tMax, vMax := 1, 0.0
	for _, ss := range [][]sample{old, part} {
		for _, s := range ss {
			tMax, vMax = max(tMax, s.T), max(vMax, f(s))
		}
	}
	vMax = max(vMax*1.1, 1)
	fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", x, y-6, title)
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x, y, pw, ph)
	for i := 0; i <= 4; i++ {
		v := vMax * float64(i) / 4
		yy := y + ph - int(float64(ph)*float64(i)/4)
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%.0f</text>`+"\n", x-6, yy+4, v)
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#eee"/>`+"\n", x, yy, x+pw, yy)
	}
	for m := 0; m*60 <= tMax; m++ {
		if m%5 != 0 {
			continue
		}
		xx := x + int(float64(pw)*float64(m*60)/float64(tMax))
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%d min</text>`+"\n", xx, y+ph+16, m)
	}
	for _, l := range []struct {
		ss    []sample
		color string
	}{{old, "#c0392b"}, {part, "#2471a3"}} {
		pts := make([]string, len(l.ss))
		for i, s := range l.ss {
			pts[i] = fmt.Sprintf("%d,%d", x+int(float64(pw)*float64(s.T)/float64(tMax)), y+ph-int(float64(ph)*f(s)/vMax))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", l.color, strings.Join(pts, " "))
	}
}
