// Command shedsim simulates the worker utilization load shedder with its
// default (Stripe's) constants over a scripted utilization, one tick a
// second, and writes the result as an SVG plot: utilization in (top), the
// share of each class shed (bottom). docs/shedding.svg is its output:
//
//	go -C benchmarks run ./cmd/shedsim > docs/shedding.svg
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/shed"
)

func main() {
	if err := render(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "shedsim:", err)
		os.Exit(1)
	}
}

// phase is utilization u until second end.
type phase struct {
	end  int
	u    float64
	note string
}

// script: a spike shorter than the 28 s delay sheds nothing; a long
// incident sheds test-mode traffic, then reads, then writes; the dead zone
// holds; a recovery at 0.3 gives traffic back slowly.
var script = []phase{
	{30, 0.5, ""},
	{50, 1, "20 s spike"},
	{120, 0.5, ""},
	{330, 1, "saturated"},
	{400, 0.75, "dead zone"},
	{720, 0.3, "recovering"},
}

// sample is the shedder's state after the tick at second t.
type sample struct {
	t    int
	u    float64
	drop [4]float64 // by series
}

var series = []struct {
	c     shed.Class
	name  string
	color string
}{
	{shed.TestMode, "test mode", "#d62728"},
	{shed.Read, "reads (GET)", "#ff7f0e"},
	{shed.Write, "writes (POST)", "#1f77b4"},
	{shed.Critical, "critical", "#2ca02c"},
}

func simulate() ([]sample, error) {
	var u float64
	w, err := shed.NewWorker(&shed.WorkerOptions{Utilization: func() float64 { return u }})
	if err != nil {
		return nil, err
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var out []sample
	t := 0
	u = script[0].u
	w.Update(t0)
	first := sample{t: 0, u: u}
	for i, sr := range series {
		first.drop[i] = w.Stats().DropChance[sr.c]
	}
	out = append(out, first)
	for _, p := range script {
		for ; t < p.end; t++ {
			u = p.u
			w.Update(t0.Add(time.Duration(t+1) * time.Second))
			s := sample{t: t + 1, u: u}
			for i, sr := range series {
				s.drop[i] = w.Stats().DropChance[sr.c]
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// Plot geometry, in SVG user units.
const (
	width  = 900
	left   = 60
	right  = 20
	plotW  = width - left - right
	topY   = 70  // utilization panel
	topH   = 140 //
	botY   = 260 // shed panel
	botH   = 220
	height = botY + botH + 70
)

func render(out io.Writer) error {
	samples, err := simulate()
	if err != nil {
		return err
	}
	end := samples[len(samples)-1].t
	x := func(t int) float64 { return left + float64(t)*plotW/float64(end) }
	yTop := func(v float64) float64 { return topY + topH - v*topH }
	yBot := func(v float64) float64 { return botY + botH - v*botH }

	b := bufio.NewWriter(out)
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="20" font-size="14" font-weight="bold">Worker utilization load shedder over time</text>`+"\n", left)
	p(`<text x="%d" y="38" fill="#555555">defaults: good below 0.7, dead zone to 0.8, 28 s before shedding starts, 120 s to shed all shed-able traffic; one tick a second</text>`+"\n", left)

	// Utilization panel: the dead zone shaded, the good and bad lines.
	p(`<text x="%d" y="%d" text-anchor="end">utilization (input)</text>`+"\n", left+plotW, topY-8)
	p(`<rect x="%d" y="%.1f" width="%d" height="%.1f" fill="#eeeeee"/>`+"\n", left, yTop(0.8), plotW, yTop(0.7)-yTop(0.8))
	for _, v := range []float64{0, 0.5, 0.7, 0.8, 1} {
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#cccccc"/>`+"\n", left, yTop(v), left+plotW, yTop(v))
		p(`<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", left-6, yTop(v)+4, v)
	}
	p(`<polyline fill="none" stroke="black" stroke-width="1.5" points="%s"/>`+"\n", points(samples, x, func(s sample) float64 { return yTop(s.u) }))
	start := 0
	for _, ph := range script {
		if ph.note != "" {
			p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555555">%s</text>`+"\n", (x(start)+x(ph.end))/2, yTop(ph.u)-5, ph.note)
		}
		start = ph.end
	}

	// Shed panel: each class's drop chance.
	p(`<text x="%d" y="%d" text-anchor="end">share of each class shed (output)</text>`+"\n", left+plotW, botY-8)
	for _, v := range []float64{0, 0.25, 0.5, 0.75, 1} {
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#cccccc"/>`+"\n", left, yBot(v), left+plotW, yBot(v))
		p(`<text x="%d" y="%.1f" text-anchor="end">%d%%</text>`+"\n", left-6, yBot(v)+4, int(v*100))
	}
	for i, sr := range series {
		p(`<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", sr.color,
			points(samples, x, func(s sample) float64 { return yBot(s.drop[i]) }))
	}
	for t := 0; t <= end; t += 60 {
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999999"/>`+"\n", x(t), botY+botH, x(t), botY+botH+4)
		p(`<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x(t), botY+botH+17, t)
	}
	p(`<text x="%d" y="%d" text-anchor="middle">seconds</text>`+"\n", left+plotW/2, botY+botH+32)
	for i, sr := range series {
		lx := left + i*170
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", lx, height-14, lx+24, height-14, sr.color)
		p(`<text x="%d" y="%d">%s</text>`+"\n", lx+30, height-10, sr.name)
	}
	p("</svg>\n")
	return b.Flush()
}

// points is a polyline's points, leaving out samples on a straight run.
func points(samples []sample, x func(int) float64, y func(sample) float64) string {
	var sb strings.Builder
	add := func(s sample) { fmt.Fprintf(&sb, "%.1f,%.1f ", x(s.t), y(s)) }
	for i, s := range samples {
		if i == 0 || i == len(samples)-1 {
			add(s)
			continue
		}
		prev, next := y(samples[i-1]), y(samples[i+1])
		if math.Abs((y(s)-prev)-(next-y(s))) > 1e-9 {
			add(s)
		}
	}
	return strings.TrimSpace(sb.String())
}
