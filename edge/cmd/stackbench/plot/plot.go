// Package plot draws stackbench's figure: p50 and p99 latency against
// concurrency, and below it the realistic workload's p50 as bars.
package plot

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"slices"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Series is one line pair of the plot: p50 and p99 against concurrency.
type Series struct {
	Name     string
	Conc     []int
	P50, P99 []float64 // ms
}

// concs are the concurrencies on the plot's x axis.
var concs = []int{1, 4, 16}

// Concs are the concurrencies on the plot's x axis.
func Concs() []int { return slices.Clone(concs) }

// Bars are one item of the workload on the plot: its p50 on each stack,
// paced and closed at concurrency 1.
type Bars struct {
	Item                                                 string
	PreloadPaced, FreshPaced, PreloadClosed, FreshClosed float64 // ms
}

// Size of a panel of the plot, in pixels.
const (
	W, H                               = 900, 560
	MarginL, MarginR, MarginT, MarginB = 70, 170, 40, 50
)

var palette = []color.RGBA{
	{0, 0, 0, 255}, {31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255}, {148, 103, 189, 255},
}

// drawPlot draws p50 (solid) and p99 (dashed) latency against concurrency
// on a log scale, one colour per series, with a legend.
func drawPlot(ss []Series) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, v := range slices.Concat(s.P50, s.P99) {
			if v > 0 {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	x0, x1, y0, y1 := MarginL, W-MarginR, H-MarginB, MarginT
	yOf := func(v float64) int {
		f := (math.Log10(max(v, lo)) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		return y0 - int(f*float64(y0-y1))
	}
	xOf := func(c int) int {
		i := slices.Index(concs, c)
		return x0 + 30 + i*(x1-x0-60)/(len(concs)-1)
	}
	grey, black := color.RGBA{220, 220, 220, 255}, color.RGBA{0, 0, 0, 255}
	for k := math.Log10(lo); k <= math.Log10(hi)+1e-9; k++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, k)
			if v > hi*1.0001 {
				break
			}
			y := yOf(v)
			line(img, x0, y, x1, y, grey, 1, false)
			label(img, x0-8-7*len(fmt.Sprint(v)), y+4, fmt.Sprint(v), black)
		}
	}
	line(img, x0, y0, x1, y0, black, 1, false)
	line(img, x0, y0, x0, y1, black, 1, false)
	for _, c := range concs {
		label(img, xOf(c)-4, y0+18, fmt.Sprint(c), black)
	}
	label(img, (x0+x1)/2-40, H-12, "concurrency", black)
	label(img, 8, 20, "latency (ms, log scale) of python print(1): p50 solid, p99 dashed", black)
	for i, s := range ss {
		col := palette[i%len(palette)]
		for j := 1; j < len(s.Conc); j++ {
			line(img, xOf(s.Conc[j-1]), yOf(s.P50[j-1]), xOf(s.Conc[j]), yOf(s.P50[j]), col, 2, false)
			line(img, xOf(s.Conc[j-1]), yOf(s.P99[j-1]), xOf(s.Conc[j]), yOf(s.P99[j]), col, 2, true)
		}
		ly := MarginT + 20 + i*20
		line(img, x1+15, ly, x1+45, ly, col, 2, false)
		label(img, x1+52, ly+4, s.Name, black)
	}
	return img
}

// line draws from (ax, ay) to (bx, by), w pixels wide, dashed or not.
func line(img *image.RGBA, ax, ay, bx, by int, c color.RGBA, w int, dashed bool) {
	n := max(abs(bx-ax), abs(by-ay), 1)
	for i := 0; i <= n; i++ {
		if dashed && (i/6)%2 == 1 {
			continue
		}
		x := ax + (bx-ax)*i/n
		y := ay + (by-ay)*i/n
		for dx := range w {
			for dy := range w {
				img.SetRGBA(x+dx, y+dy, c)
			}
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// label writes s with its baseline at (x, y).
func label(img *image.RGBA, x, y int, s string, c color.RGBA) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// Write draws ss, and below it the workload's bars ws, into the PNG
// file path; either is left out when it has nothing to draw.
func Write(path string, ss []Series, ws []Bars) error {
	var panels []*image.RGBA
	if len(ss) > 0 || len(ws) == 0 {
		panels = append(panels, drawPlot(ss))
	}
	if len(ws) > 0 {
		panels = append(panels, drawBars(ws))
	}
	img := image.NewRGBA(image.Rect(0, 0, W, H*len(panels)))
	for i, p := range panels {
		draw.Draw(img, p.Bounds().Add(image.Pt(0, i*H)), p, image.Point{}, draw.Src)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return f.Close()
}

// drawBars draws, per item, four bars on a log scale: p50 paced and
// closed at concurrency 1, fresh (light) and preloaded (dark).
func drawBars(ws []Bars) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	lo, hi := 1.0, 10.0
	for _, w := range ws {
		for _, v := range []float64{w.PreloadPaced, w.FreshPaced, w.PreloadClosed, w.FreshClosed} {
			if v > 0 {
				hi = max(hi, v)
			}
		}
	}
	lo, hi = 1, math.Pow(10, math.Ceil(math.Log10(hi)))
	x0, x1, y0, y1 := MarginL, W-MarginR, H-MarginB-20, MarginT
	yOf := func(v float64) int {
		f := (math.Log10(max(v, lo)) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		return y0 - int(f*float64(y0-y1))
	}
	grey, black := color.RGBA{220, 220, 220, 255}, color.RGBA{0, 0, 0, 255}
	for k := 0.0; k <= math.Log10(hi)+1e-9; k++ {
		v := math.Pow(10, k)
		line(img, x0, yOf(v), x1, yOf(v), grey, 1, false)
		label(img, x0-8-7*len(fmt.Sprint(v)), yOf(v)+4, fmt.Sprint(v), black)
	}
	line(img, x0, y0, x1, y0, black, 1, false)
	line(img, x0, y0, x0, y1, black, 1, false)
	label(img, 8, 20, "realistic workload, stateless through the edge: p50 (ms, log scale) at concurrency 1", black)
	fresh, preload := color.RGBA{180, 180, 180, 255}, palette[1]
	freshPaced, preloadPaced := color.RGBA{255, 200, 150, 255}, palette[2]
	slot := (x1 - x0) / max(len(ws), 1)
	bw := max(slot/6, 2)
	for i, w := range ws {
		left := x0 + i*slot + slot/6
		for j, v := range []struct {
			ms  float64
			col color.RGBA
		}{{w.FreshPaced, freshPaced}, {w.PreloadPaced, preloadPaced}, {w.FreshClosed, fresh}, {w.PreloadClosed, preload}} {
			if v.ms > 0 {
				draw.Draw(img, image.Rect(left+j*bw, yOf(v.ms), left+(j+1)*bw-1, y0), image.NewUniform(v.col), image.Point{}, draw.Src)
			}
		}
		name, _, _ := strings.Cut(w.Item, ":")
		label(img, x0+i*slot+4, y0+16, name, black)
	}
	for i, l := range []struct {
		name string
		col  color.RGBA
	}{{"fresh, paced", freshPaced}, {"preload, paced", preloadPaced}, {"fresh, closed", fresh}, {"preload, closed", preload}} {
		ly := MarginT + 20 + i*20
		draw.Draw(img, image.Rect(x1+15, ly-6, x1+45, ly+4), image.NewUniform(l.col), image.Point{}, draw.Src)
		label(img, x1+52, ly+4, l.name, black)
	}
	return img
}
