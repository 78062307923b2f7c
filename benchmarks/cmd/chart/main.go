// Command chart draws calls/s against goroutines, as an SVG line chart,
// from the output of `go test -bench` of a benchmark with sub-benchmarks
// named goroutines=N that report metrics in units ending in -calls/s (one
// line per unit, the series; the median of repeated runs, -count). It
// draws docs/redis-batching.svg from BenchmarkRedisBatchScaling:
//
//	cd benchmarks && go test -run '^$' -bench RedisBatchScaling -benchtime 3x -count 3 . | tee /tmp/scaling.txt
//	go run ./cmd/chart -bench BenchmarkRedisBatchScaling -title '…' < /tmp/scaling.txt > ../docs/redis-batching.svg
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	bench := flag.String("bench", "BenchmarkRedisBatchScaling", "the benchmark whose sub-benchmarks are goroutines=N")
	title := flag.String("title", "Take calls/s against goroutines", "the chart's title")
	flag.Parse()
	series, err := parse(os.Stdin, *bench)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
	if len(series) == 0 {
		fmt.Fprintf(os.Stderr, "chart: no %s/goroutines=N lines with -calls/s metrics in the input\n", *bench)
		os.Exit(1)
	}
	if _, err := io.WriteString(os.Stdout, draw(series, *title)); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

// series maps a series' name to its points: goroutines to calls/s.
type series map[string]map[int]float64

// parse reads benchmark lines such as
//
//	BenchmarkX/goroutines=64-2   3   1 ns/op   5.1e4 a-calls/s   2.0 a/b
//
// and returns, for each unit ending in -calls/s, the median over the lines
// of each goroutine count.
func parse(r io.Reader, bench string) (series, error) {
	samples := map[string]map[int][]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	prefix := bench + "/goroutines="
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], prefix) {
			continue
		}
		n := strings.TrimPrefix(f[0], prefix)
		if i := strings.IndexByte(n, '-'); i >= 0 { // the GOMAXPROCS suffix
			n = n[:i]
		}
		g, err := strconv.Atoi(n)
		if err != nil || g < 1 {
			return nil, fmt.Errorf("%q: bad goroutine count", f[0])
		}
		for i := 2; i+1 < len(f); i += 2 {
			name, ok := strings.CutSuffix(f[i+1], "-calls/s")
			if !ok {
				continue
			}
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%q: %v", f[0], err)
			}
			if samples[name] == nil {
				samples[name] = map[int][]float64{}
			}
			samples[name][g] = append(samples[name][g], v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := series{}
	for name, byG := range samples {
		out[name] = map[int]float64{}
		for g, vs := range byG {
			slices.Sort(vs)
			m := vs[len(vs)/2]
			if len(vs)%2 == 0 {
				m = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
			}
			out[name][g] = m
		}
	}
	return out, nil
}

var colors = []string{"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

// draw renders the series: goroutines on a log2 axis, calls/s on a linear
// one from zero.
func draw(s series, title string) string {
	const (
		width, height          = 720, 420
		left, right, top, down = 80, 200, 40, 50
	)
	names := make([]string, 0, len(s))
	var gs []int
	maxY := 0.0
	for name, pts := range s {
		names = append(names, name)
		for g, v := range pts {
			if !slices.Contains(gs, g) {
				gs = append(gs, g)
			}
			maxY = max(maxY, v)
		}
	}
	slices.Sort(names)
	slices.Sort(gs)
	step := niceStep(maxY / 5)
	maxY = math.Ceil(maxY/step) * step
	lo, hi := math.Log2(float64(gs[0])), math.Log2(float64(gs[len(gs)-1]))
	if hi == lo {
		hi = lo + 1
	}
	x := func(g int) float64 {
		return left + (math.Log2(float64(g))-lo)/(hi-lo)*(width-left-right)
	}
	y := func(v float64) float64 { return height - down - v/maxY*(height-top-down) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15">%s</text>`+"\n", left, escape(title))
	for v := 0.0; v <= maxY+step/2; v += step {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(v), width-right, y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, thousands(v))
	}
	for _, g := range gs {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(g), top, x(g), height-down)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x(g), height-down+16, g)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">goroutines</text>`+"\n", (left+width-right)/2, height-12)
	fmt.Fprintf(&b, `<text transform="translate(18 %d) rotate(-90)" text-anchor="middle">calls/s</text>`+"\n", (top+height-down)/2)
	for i, name := range names {
		c := colors[i%len(colors)]
		var pts []string
		for _, g := range gs {
			if v, ok := s[name][g]; ok {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(g), y(v)))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		for _, p := range pts {
			xy := strings.Split(p, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], c)
		}
		ly := top + 10 + 22*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", width-right+14, ly, width-right+34, ly, c)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+40, ly+4, escape(name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceStep rounds a grid step up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
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

func thousands(v float64) string {
	if v >= 1000 {
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
