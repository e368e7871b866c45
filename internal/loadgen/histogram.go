package loadgen

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// histogramBins is the number of bars; a last bar counts what lies beyond.
const histogramBins = 40

// histogram buckets ds linearly from 0 to a round number above their 99th
// percentile; a last, overflow bucket holds the rest, up to the maximum.
func histogram(ds []time.Duration) []Bucket {
	if len(ds) == 0 {
		return nil
	}
	sorted := slices.Sorted(slices.Values(ds))
	upper := roundUp(ms(percentile(sorted, 99)) * 1.25)
	width := upper / histogramBins
	buckets := make([]Bucket, histogramBins+1)
	for i := range histogramBins {
		buckets[i] = Bucket{From: float64(i) * width, To: float64(i+1) * width}
	}
	buckets[histogramBins] = Bucket{From: upper, To: max(ms(sorted[len(sorted)-1]), upper), Overflow: true}
	for _, d := range sorted {
		i := min(int(ms(d)/width), histogramBins)
		buckets[max(i, 0)].Count++
	}
	if buckets[histogramBins].Count == 0 {
		buckets = buckets[:histogramBins]
	}
	return buckets
}

// roundUp rounds v up to 1, 2 or 5 times a power of ten.
func roundUp(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// chart is the geometry shared by the SVG and the PNG.
type chart struct {
	w, h                     int
	left, right, top, bottom int
	buckets                  []Bucket
	maxCount                 int
	title                    string
	marks                    []mark
}

type mark struct {
	label string
	ms    float64
}

func (r *Result) chart() chart {
	c := chart{w: 900, h: 420, left: 70, right: 20, top: 40, bottom: 50, buckets: r.Histogram}
	for _, b := range c.buckets {
		c.maxCount = max(c.maxCount, b.Count)
	}
	l := r.PlacedToConfirmed
	c.title = fmt.Sprintf("placed→confirmed latency, %d orders (run %s, %.0f orders/s)", l.Count, r.RunID, r.PlacedPerSecond)
	c.marks = []mark{{"p50", l.P50}, {"p95", l.P95}, {"p99", l.P99}}
	return c
}

// upper is the right end of the x axis, in milliseconds.
func (c chart) upper() float64 {
	last := c.buckets[len(c.buckets)-1]
	if last.Overflow {
		return last.From + (last.From / histogramBins)
	}
	return last.To
}

func (c chart) x(msv float64) float64 {
	return float64(c.left) + min(msv/c.upper(), 1)*float64(c.w-c.left-c.right)
}

func (c chart) y(count int) float64 {
	return float64(c.h-c.bottom) - float64(count)/float64(max(c.maxCount, 1))*float64(c.h-c.top-c.bottom)
}

// bar returns the x range of bucket b.
func (c chart) bar(b Bucket) (x0, x1 float64) {
	if b.Overflow {
		return c.x(b.From), c.x(c.upper())
	}
	return c.x(b.From), c.x(b.To)
}

// WriteHistogram draws the placed→confirmed histogram to path, as SVG or
// PNG by its extension.
func (r *Result) WriteHistogram(path string) error {
	if len(r.Histogram) == 0 {
		return fmt.Errorf("histogram: no confirmed orders to draw")
	}
	var (
		b   []byte
		err error
	)
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg":
		b = r.chart().svg()
	case ".png":
		b, err = r.chart().png()
	default:
		return fmt.Errorf("histogram %s: want a .svg or .png file", path)
	}
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write histogram: %w", err)
	}
	return nil
}

func (c chart) svg() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", c.w, c.h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", c.w, c.h)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", c.left, xmlEscape(c.title))
	for _, bk := range c.buckets {
		x0, x1 := c.bar(bk)
		y := c.y(bk.Count)
		fill := "#4c78a8"
		if bk.Overflow {
			fill = "#b0b0b0"
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%.1f–%.1f ms: %d</title></rect>`+"\n",
			x0+0.5, y, max(x1-x0-1, 0.5), float64(c.h-c.bottom)-y, fill, bk.From, bk.To, bk.Count)
	}
	// Axes and ticks.
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", c.left, c.h-c.bottom, c.w-c.right, c.h-c.bottom)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", c.left, c.top, c.left, c.h-c.bottom)
	for i := 0; i <= 5; i++ {
		v := c.upper() * float64(i) / 5
		x := c.x(v)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, c.h-c.bottom+16, fmtMS(v))
		n := c.maxCount * i / 5
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%d</text>`+"\n", c.left-6, c.y(n)+4, n)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">milliseconds (order timeline)</text>`+"\n", (c.left+c.w-c.right)/2, c.h-10)
	fmt.Fprintf(&b, `<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">orders</text>`+"\n", (c.top+c.h-c.bottom)/2, (c.top+c.h-c.bottom)/2)
	for i, m := range c.marks {
		x := c.x(m.ms)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e45756" stroke-dasharray="4 3"/>`+"\n", x, c.top, x, c.h-c.bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#e45756">%s %s</text>`+"\n", x+3, c.top+12+14*i, m.label, fmtMS(m.ms))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

func (c chart) png() ([]byte, error) {
	img := image.NewRGBA(image.Rect(0, 0, c.w, c.h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	fill := func(x0, y0, x1, y1 float64, col color.Color) {
		draw.Draw(img, image.Rect(int(x0), int(y0), int(math.Ceil(x1)), int(math.Ceil(y1))), image.NewUniform(col), image.Point{}, draw.Src)
	}
	black := color.Black
	red := color.RGBA{0xe4, 0x57, 0x56, 0xff}
	for _, bk := range c.buckets {
		x0, x1 := c.bar(bk)
		col := color.Color(color.RGBA{0x4c, 0x78, 0xa8, 0xff})
		if bk.Overflow {
			col = color.RGBA{0xb0, 0xb0, 0xb0, 0xff}
		}
		fill(x0+1, c.y(bk.Count), max(x1-1, x0+2), float64(c.h-c.bottom), col)
	}
	fill(float64(c.left), float64(c.h-c.bottom), float64(c.w-c.right), float64(c.h-c.bottom+1), black)
	fill(float64(c.left), float64(c.top), float64(c.left+1), float64(c.h-c.bottom), black)
	text := func(x, y int, s string, col color.Color) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	width := func(s string) int { return font.MeasureString(basicfont.Face7x13, s).Ceil() }
	// The bitmap font has ASCII only.
	text(c.left, 22, strings.ReplaceAll(c.title, "→", "->"), black)
	for i := 0; i <= 5; i++ {
		v := c.upper() * float64(i) / 5
		s := fmtMS(v)
		text(int(c.x(v))-width(s)/2, c.h-c.bottom+16, s, black)
		n := fmt.Sprint(c.maxCount * i / 5)
		text(c.left-6-width(n), int(c.y(c.maxCount*i/5))+4, n, black)
	}
	label := "milliseconds (order timeline)"
	text((c.left+c.w-c.right-width(label))/2, c.h-10, label, black)
	for i, m := range c.marks {
		x := c.x(m.ms)
		for y := c.top; y < c.h-c.bottom; y += 7 {
			fill(x, float64(y), x+1, float64(min(y+4, c.h-c.bottom)), red)
		}
		text(int(x)+3, c.top+12+14*i, m.label+" "+fmtMS(m.ms), red)
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return nil, fmt.Errorf("encode histogram: %w", err)
	}
	return b.Bytes(), nil
}

func fmtMS(v float64) string {
	if v >= 100 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0fms", v)
	}
	return fmt.Sprintf("%.1fms", v)
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
