package pipeline

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
	"testing"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// The chart of BenchmarkPacing: delivered messages per second over the
// drain, as 100 ms bins (bars) and as a trailing 1 s window (line), against
// the provider's rate and rate + burst (the most a token bucket lets through
// in any 1 s). Drawn with the standard library and basicfont.

const (
	chartW, chartH = 1000, 580
	plotL, plotR   = 72, chartW - 28
	plotT, plotB   = 100, chartH - 58
	chartBin       = 100 * time.Millisecond
	chartStep      = 20 * time.Millisecond // of the trailing window
)

var (
	colBack   = color.RGBA{255, 255, 255, 255}
	colGrid   = color.RGBA{228, 228, 228, 255}
	colAxis   = color.RGBA{60, 60, 60, 255}
	colText   = color.RGBA{30, 30, 30, 255}
	colBins   = color.RGBA{140, 180, 225, 255}
	colWindow = color.RGBA{22, 82, 160, 255}
	colRate   = color.RGBA{38, 150, 60, 255}
	colCeil   = color.RGBA{205, 60, 70, 255}
	colTokens = color.RGBA{240, 150, 40, 255}
)

// writeChart draws the arrivals (and, if not nil, the bucket's tokens on
// the same time axis) against rate and burst and writes it as a PNG to
// path, creating its directory.
func writeChart(path string, arrivals pacing, tokens *pacing, rate, burst float64, title, summary string) error {
	img := drawChart(arrivals, tokens, rate, burst, title, summary)
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// chart maps seconds and messages/s to pixels.
type chart struct {
	img        *image.RGBA
	xmax, ymax float64
}

func (c chart) x(s float64) float64 { return plotL + s/c.xmax*(plotR-plotL) }
func (c chart) y(v float64) float64 { return plotB - v/c.ymax*(plotB-plotT) }

func drawChart(p pacing, tokens *pacing, rate, burst float64, title, summary string) *image.RGBA {
	bins := p.bins(chartBin)
	trail := p.trailing(time.Second, chartStep)
	peak := rate + burst
	for _, n := range bins {
		peak = max(peak, float64(n)/chartBin.Seconds())
	}
	for _, n := range trail {
		peak = max(peak, float64(n))
	}
	c := chart{
		img:  image.NewRGBA(image.Rect(0, 0, chartW, chartH)),
		xmax: niceCeil(max(p.end().Seconds()+0.5, 1), 1),
		ymax: niceCeil(peak*1.15, 50),
	}
	draw.Draw(c.img, c.img.Bounds(), image.NewUniform(colBack), image.Point{}, draw.Src)

	// Grid and tick labels.
	ystep := tickStep(c.ymax, 8)
	for v := 0.0; v <= c.ymax+1e-9; v += ystep {
		c.line(plotL, c.y(v), plotR, c.y(v), colGrid, 1, 0)
		label := fmt.Sprintf("%g", v)
		c.text(plotL-8-7*len(label), int(c.y(v))+4, label, colText, 1)
	}
	xstep := tickStep(c.xmax, 12)
	for s := 0.0; s <= c.xmax+1e-9; s += xstep {
		c.line(c.x(s), plotT, c.x(s), plotB, colGrid, 1, 0)
		c.line(c.x(s), plotB, c.x(s), plotB+5, colAxis, 1, 0)
		label := fmt.Sprintf("%g", s)
		c.text(int(c.x(s))-7*len(label)/2, plotB+19, label, colText, 1)
	}

	// 100 ms bins as a step line, the limits, then the trailing 1 s windows on top.
	prev := plotB + 0.0
	for i, n := range bins {
		x0, x1 := c.x(float64(i)*chartBin.Seconds()), c.x(float64(i+1)*chartBin.Seconds())
		y := c.y(float64(n) / chartBin.Seconds())
		c.line(x0, prev, x0, y, colBins, 1, 0)
		c.line(x0, y, x1, y, colBins, 1, 0)
		prev = y
	}
	c.line(c.x(float64(len(bins))*chartBin.Seconds()), prev, c.x(float64(len(bins))*chartBin.Seconds()), plotB, colBins, 1, 0)
	c.line(plotL, c.y(rate), plotR, c.y(rate), colRate, 2, 10)
	c.line(plotL, c.y(rate+burst), plotR, c.y(rate+burst), colCeil, 2, 6)
	c.series(trail, colWindow, 3)
	if tokens != nil { // on top, thinner: where the two agree, both show
		c.series(tokens.trailing(time.Second, chartStep), colTokens, 1)
	}

	// Axes, titles, legend.
	c.line(plotL, plotT, plotL, plotB, colAxis, 1, 0)
	c.line(plotL, plotB, plotR, plotB, colAxis, 1, 0)
	c.text(plotL, 30, "Delivered rate under backlog", colText, 2)
	c.text(plotL, 52, title, colText, 1)
	c.text(plotL, 70, summary, colText, 1)
	c.text(plotL-40, plotT-10, "messages/s", colText, 1)
	xl := "seconds since the drain began"
	c.text((plotL+plotR)/2-7*len(xl)/2, chartH-16, xl, colText, 1)
	items := []legendItem{
		{"delivered per 100 ms bin, as a rate", colBins, 0, 1},
		{"delivered in the trailing 1 s", colWindow, 0, 3},
	}
	if tokens != nil {
		items = append(items, legendItem{"tokens given out in the trailing 1 s (Redis time)", colTokens, 0, 1})
	}
	c.legend(append(items,
		legendItem{fmt.Sprintf("provider rate %g/s", rate), colRate, 10, 2},
		legendItem{fmt.Sprintf("rate + burst = %g: most a token bucket allows in 1 s", rate+burst), colCeil, 6, 2},
	))
	return c.img
}

type legendItem struct {
	label string
	col   color.RGBA
	dash  int // 0: solid
	width int
}

// legend draws the items in a box at the plot's top right, above the rate
// lines, where only the opening burst reaches.
func (c chart) legend(items []legendItem) {
	wide := 0
	for _, it := range items {
		wide = max(wide, len(it.label))
	}
	w, h := 44+7*wide+12, 20*len(items)+10
	x0, y0 := plotR-w-10, plotT+10
	fill(c.img, image.Rect(x0, y0, x0+w, y0+h), colBack)
	box := image.Rect(x0, y0, x0+w, y0+h)
	c.line(float64(box.Min.X), float64(box.Min.Y), float64(box.Max.X), float64(box.Min.Y), colAxis, 1, 0)
	c.line(float64(box.Min.X), float64(box.Max.Y), float64(box.Max.X), float64(box.Max.Y), colAxis, 1, 0)
	c.line(float64(box.Min.X), float64(box.Min.Y), float64(box.Min.X), float64(box.Max.Y), colAxis, 1, 0)
	c.line(float64(box.Max.X), float64(box.Min.Y), float64(box.Max.X), float64(box.Max.Y), colAxis, 1, 0)
	for i, it := range items {
		y := float64(y0 + 15 + 20*i)
		c.line(float64(x0+10), y, float64(x0+36), y, it.col, it.width, it.dash)
		c.text(x0+44, int(y)+4, it.label, colText, 1)
	}
}

// series draws counts taken every chartStep from 0 as a line.
func (c chart) series(counts []int, col color.RGBA, width int) {
	for i := 1; i < len(counts); i++ {
		t0, t1 := float64(i-1)*chartStep.Seconds(), float64(i)*chartStep.Seconds()
		c.line(c.x(t0), c.y(float64(counts[i-1])), c.x(t1), c.y(float64(counts[i])), col, width, 0)
	}
}

// line draws a segment width pixels thick, dashed when dash > 0 (dash
// pixels on, dash off).
func (c chart) line(x0, y0, x1, y1 float64, col color.RGBA, width, dash int) {
	n := math.Hypot(x1-x0, y1-y0)
	for d := 0.0; d <= n; d += 0.5 {
		if dash > 0 && int(d)/dash%2 == 1 {
			continue
		}
		f := 0.0
		if n > 0 {
			f = d / n
		}
		x, y := int(math.Round(x0+f*(x1-x0))), int(math.Round(y0+f*(y1-y0)))
		o := (width - 1) / 2
		fill(c.img, image.Rect(x-o, y-o, x-o+width, y-o+width), col)
	}
}

// text draws s with its baseline at y, scale times the 7x13 basic font.
func (c chart) text(x, y int, s string, col color.RGBA, scale int) {
	face := basicfont.Face7x13
	mask := image.NewAlpha(image.Rect(0, 0, 7*len(s), 13))
	d := font.Drawer{Dst: mask, Src: image.Opaque, Face: face, Dot: fixed.P(0, face.Ascent)}
	d.DrawString(s)
	b := mask.Bounds()
	for my := b.Min.Y; my < b.Max.Y; my++ {
		for mx := b.Min.X; mx < b.Max.X; mx++ {
			if mask.AlphaAt(mx, my).A == 0 {
				continue
			}
			px, py := x+mx*scale, y-face.Ascent*scale+my*scale
			fill(c.img, image.Rect(px, py, px+scale, py+scale), col)
		}
	}
}

func fill(img *image.RGBA, r image.Rectangle, col color.RGBA) {
	draw.Draw(img, r.Intersect(img.Bounds()), image.NewUniform(col), image.Point{}, draw.Src)
}

// niceCeil rounds v up to a multiple of unit.
func niceCeil(v, unit float64) float64 { return math.Ceil(v/unit) * unit }

// tickStep returns 1, 2 or 5 times a power of ten so that [0, span] has at
// most n ticks.
func tickStep(span float64, n int) float64 {
	for p := 1.0; ; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if span/(m*p) <= float64(n) {
				return m * p
			}
		}
	}
}

func TestChart(t *testing.T) {
	// A synthetic drain of 400 messages: a burst of 20, then 200/s.
	p := pacing{}
	for i := range 400 {
		at := time.Duration(0)
		if i >= 20 {
			at = time.Duration(i-20) * 5 * time.Millisecond
		}
		p.at = append(p.at, at)
	}
	path := filepath.Join(t.TempDir(), "sub", "chart.png")
	if err := writeChart(path, p, &p, 200, 20, "test", "a synthetic drain"); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if got := img.Bounds().Size(); got != image.Pt(chartW, chartH) {
		t.Errorf("chart is %v, want %dx%d", got, chartW, chartH)
	}
	if got := p.maxWindow(time.Second); got != 220 {
		t.Errorf("the synthetic drain has %d in its busiest second, want 220 (rate + burst)", got)
	}
}

func TestTickStep(t *testing.T) {
	for _, tt := range []struct {
		span float64
		n    int
		want float64
	}{
		{21, 12, 2}, {400, 8, 50}, {10, 12, 1}, {300, 8, 50}, {1, 12, 1}, {60, 12, 5},
	} {
		if got := tickStep(tt.span, tt.n); got != tt.want {
			t.Errorf("tickStep(%v, %d) = %v, want %v", tt.span, tt.n, got, tt.want)
		}
	}
}
