// Command archsvg draws the packages of the module at -root (throttlekit's,
// from this benchmarks module) on floors by their imports and writes the
// picture as SVG. docs/architecture.svg is its output:
//
//	go -C benchmarks run ./cmd/archsvg -root .. > docs/architecture.svg
//
// It reads the import lists of the source (go/build, for linux/amd64, test
// files left out), so it needs neither the network nor the go command. A
// package's floor is one above the highest package it imports (floor 0
// imports none of those drawn), so every arrow points down. An arrow is drawn
// only where no longer path of imports joins the two packages: the picture
// shows the layering, deps_test.go and the code the full lists.
//
// Drawn: every package of the module except the helpers in the top-level
// internal/ that import nothing of the module but other helpers (named in
// the footnote), programs outside cmd/, and internal packages no drawn
// package imports (test support). Nested modules
// (integration/, benchmarks/) are not part of the module.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"go/build"
	"html"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	root := flag.String("root", ".", "the module's root directory (holding go.mod)")
	flag.Parse()
	g, err := load(*root)
	if err == nil {
		err = render(os.Stdout, g)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "archsvg:", err)
		os.Exit(1)
	}
}

// pkg is one package of the module: its path inside the module ("" for the
// root), whether it is a program, and the module's packages it imports.
type pkg struct {
	rel     string
	main    bool
	imports []string
}

// graph is what gets drawn: the packages by floor, each floor in the order
// drawn, with a waypoint (a name starting with "~") on every floor an arrow
// passes; the arrows (importer, waypoints top down, imported); and the
// helpers left out.
type graph struct {
	floors  [][]string
	arrows  [][]string
	hidden  []string
	floorOf map[string]int
}

// load reads every package of the module under root and builds the graph.
func load(root string) (*graph, error) {
	modPath, err := modulePath(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	ctx := build.Default
	ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = "linux", "amd64", false
	pkgs := map[string]*pkg{}
	err = filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if dir != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
			return filepath.SkipDir
		}
		if dir != root {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
		}
		bp, err := ctx.ImportDir(dir, 0)
		var noGo *build.NoGoError
		if errors.As(err, &noGo) || (err == nil && len(bp.GoFiles) == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return err
		}
		p := &pkg{rel: filepath.ToSlash(rel), main: bp.Name == "main"}
		for _, imp := range bp.Imports {
			if r, ok := strings.CutPrefix(imp, modPath+"/"); ok {
				p.imports = append(p.imports, r)
			}
		}
		pkgs[p.rel] = p
		return nil
	})
	if err != nil {
		return nil, err
	}
	return layout(pkgs), nil
}

// modulePath reads the module line of a go.mod file.
func modulePath(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no module line", file)
}

// layout chooses what is drawn, puts each package on its floor, keeps the
// arrows no longer path implies, and orders each floor so that a package
// sits near what it imports.
func layout(pkgs map[string]*pkg) *graph {
	g := &graph{floorOf: map[string]int{}}
	topInternal := func(rel string) bool { return rel == "internal" || strings.HasPrefix(rel, "internal/") }
	internal := func(rel string) bool { return slices.Contains(strings.Split(rel, "/"), "internal") }
	// A helper is a package of the top-level internal/ that imports nothing
	// of the module but other helpers: it sits below every floor, so it is
	// named in the footnote instead of drawn.
	helpers := map[string]bool{}
	var helper func(string) bool
	helper = func(rel string) bool {
		if h, ok := helpers[rel]; ok {
			return h
		}
		p := pkgs[rel]
		h := p != nil && topInternal(rel) && !p.main
		for i := 0; h && i < len(p.imports); i++ {
			h = helper(p.imports[i])
		}
		helpers[rel] = h
		return h
	}
	drawn := map[string]bool{}
	for rel, p := range pkgs {
		switch {
		case rel == "":
		case p.main && !strings.HasPrefix(rel, "cmd/"):
		case helper(rel):
			g.hidden = append(g.hidden, rel)
		case internal(rel):
		default:
			drawn[rel] = true
		}
	}
	// Any other internal package (the stores' shared arithmetic, metrics'
	// shared definitions) is drawn when a drawn package imports it, not when
	// only tests do; until no more are found, as one may be imported only by
	// another.
	for more := true; more; {
		more = false
		for rel, p := range pkgs {
			if !internal(rel) || drawn[rel] || p.main || helper(rel) {
				continue
			}
			for d := range drawn {
				if slices.Contains(pkgs[d].imports, rel) {
					drawn[rel], more = true, true
					break
				}
			}
		}
	}
	slices.Sort(g.hidden)
	deps := map[string][]string{}
	for rel := range drawn {
		for _, imp := range pkgs[rel].imports {
			if drawn[imp] {
				deps[rel] = append(deps[rel], imp)
			}
		}
		slices.Sort(deps[rel])
	}
	var floor func(string) int
	floor = func(rel string) int {
		if f, ok := g.floorOf[rel]; ok {
			return f
		}
		g.floorOf[rel] = 0 // the module's imports have no cycles
		f := 0
		for _, d := range deps[rel] {
			f = max(f, floor(d)+1)
		}
		g.floorOf[rel] = f
		return f
	}
	names := make([]string, 0, len(drawn))
	for rel := range drawn {
		names = append(names, rel)
		floor(rel)
	}
	slices.Sort(names)
	for _, rel := range names {
		f := g.floorOf[rel]
		for len(g.floors) <= f {
			g.floors = append(g.floors, nil)
		}
		g.floors[f] = append(g.floors[f], rel)
	}
	// reach[a][b]: b is reachable from a through one import or more.
	reach := map[string]map[string]bool{}
	var visit func(string) map[string]bool
	visit = func(rel string) map[string]bool {
		if r, ok := reach[rel]; ok {
			return r
		}
		r := map[string]bool{}
		for _, d := range deps[rel] {
			r[d] = true
			for x := range visit(d) {
				r[x] = true
			}
		}
		reach[rel] = r
		return r
	}
	// Each arrow gets a waypoint on every floor it crosses, so that it can
	// pass between the packages there instead of through them.
	down, up := map[string][]string{}, map[string][]string{}
	link := func(a, b string) { down[a] = append(down[a], b); up[b] = append(up[b], a) }
	for _, rel := range names {
		for _, d := range deps[rel] {
			implied := false
			for _, o := range deps[rel] {
				if o != d && visit(o)[d] {
					implied = true
					break
				}
			}
			if implied {
				continue
			}
			arrow, prev := []string{rel}, rel
			for f := g.floorOf[rel] - 1; f > g.floorOf[d]; f-- {
				w := fmt.Sprintf("~%s>%s@%d", rel, d, f)
				g.floorOf[w] = f
				g.floors[f] = append(g.floors[f], w)
				arrow = append(arrow, w)
				link(prev, w)
				prev = w
			}
			link(prev, d)
			g.arrows = append(g.arrows, append(arrow, d))
		}
	}
	// Order the floors by sweeps, bottom up then top down, each putting a
	// package at the mean position of its neighbours on the floor it looks
	// at (ties, and packages with none there, by where they were, then by
	// name).
	pos := map[string]float64{}
	place := func(row []string) {
		for i, n := range row {
			pos[n] = (float64(i) + 0.5) / float64(len(row))
		}
	}
	for _, row := range g.floors {
		slices.Sort(row)
		place(row)
	}
	sweep := func(row []string, nbrs map[string][]string) {
		key := map[string]float64{}
		for _, n := range row {
			key[n] = pos[n]
			if len(nbrs[n]) > 0 {
				s := 0.0
				for _, m := range nbrs[n] {
					s += pos[m]
				}
				key[n] = s / float64(len(nbrs[n]))
			}
		}
		slices.SortStableFunc(row, func(a, b string) int {
			if key[a] != key[b] {
				if key[a] < key[b] {
					return -1
				}
				return 1
			}
			return strings.Compare(a, b)
		})
		place(row)
	}
	for range 4 {
		for f := 1; f < len(g.floors); f++ {
			sweep(g.floors[f], down)
		}
		for f := len(g.floors) - 2; f >= 0; f-- {
			sweep(g.floors[f], up)
		}
	}
	return g
}

// Sizes in SVG units; the labels are monospace, so their width is known.
const (
	charW   = 7.8
	fontPx  = 13
	padX    = 10.0
	boxH    = 28.0
	gapX    = 18.0
	wayW    = 6.0
	rowH    = 74.0
	marginL = 80.0
	marginR = 20.0
	marginT = 40.0
	lineH   = 18.0
)

// fill colours a package by its part: the core, the internal packages
// the stores and wrappers share, the stores, the metrics adapters, the
// programs, and the rest (wrappers and features).
func fill(rel string) string {
	switch {
	case rel == "throttler" || rel == "backend":
		return "#fde9c8"
	case strings.HasPrefix(rel, "internal/"):
		return "#ffffff"
	case strings.HasPrefix(rel, "backend/"):
		return "#dcebf7"
	case strings.HasPrefix(rel, "metrics/"):
		return "#f4e6f7"
	case strings.HasPrefix(rel, "cmd/"):
		return "#ececec"
	}
	return "#e3f2df"
}

func waypoint(n string) bool { return strings.HasPrefix(n, "~") }

func boxW(n string) float64 {
	if waypoint(n) {
		return wayW
	}
	return float64(len(n))*charW + 2*padX
}

type box struct{ x, y, w float64 }

// render writes the graph as an SVG picture.
func render(w io.Writer, g *graph) error {
	notes := []string{
		"Orange: the core; white: internal/, which only this module imports; blue: the stores;",
		"green: wrappers and features; purple: metrics; grey: programs.",
		"An import that a longer path of imports already implies has no arrow of its own.",
		"Not drawn: " + strings.Join(g.hidden, ", ") + " (helpers importing nothing of the module).",
		"Generated from the imports: go -C benchmarks run ./cmd/archsvg -root .. > docs/architecture.svg",
	}
	boxes := map[string]box{}
	width := 0.0
	rowW := make([]float64, len(g.floors))
	for f, row := range g.floors {
		for i, n := range row {
			if i > 0 {
				rowW[f] += gapX
			}
			rowW[f] += boxW(n)
		}
		width = max(width, rowW[f])
	}
	for _, n := range notes {
		width = max(width, float64(len(n))*7.0-marginL+12)
	}
	total := marginL + width + marginR
	foot := marginT + float64(len(g.floors))*rowH
	height := foot + float64(len(notes))*lineH + 16
	for f, row := range g.floors {
		y := marginT + float64(len(g.floors)-1-f)*rowH + (rowH-boxH)/2
		x := marginL + (width-rowW[f])/2
		for _, n := range row {
			boxes[n] = box{x, y, boxW(n)}
			x += boxW(n) + gapX
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="monospace" font-size="%d">`+"\n",
		total, height, total, height, fontPx)
	b.WriteString(`<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>` + "\n")
	fmt.Fprintf(&b, `<rect width="%.0f" height="%.0f" fill="white"/>`+"\n", total, height)
	fmt.Fprintf(&b, `<text x="12" y="24" font-size="15" font-family="sans-serif">throttlekit's packages, each one floor above the highest it imports; an arrow is an import</text>`+"\n")
	for f := range g.floors {
		y := marginT + float64(len(g.floors)-1-f)*rowH + rowH/2
		fmt.Fprintf(&b, `<text x="12" y="%.1f" fill="#777" font-family="sans-serif">floor %d</text>`+"\n", y+4, f)
		if f > 0 {
			fmt.Fprintf(&b, `<line x1="12" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", total-marginR, y+rowH/2, y+rowH/2)
		}
	}
	// Spread the arrows leaving a package along its bottom, and those
	// reaching one along its top, in the order of where their other ends
	// lie.
	center := func(n string) float64 { return boxes[n].x + boxes[n].w/2 }
	out, in := map[string][]int{}, map[string][]int{}
	for i, a := range g.arrows {
		out[a[0]] = append(out[a[0]], i)
		in[a[len(a)-1]] = append(in[a[len(a)-1]], i)
	}
	startX, endX := make([]float64, len(g.arrows)), make([]float64, len(g.arrows))
	spread := func(n string, arrows []int, other func(int) string, set []float64) {
		slices.SortStableFunc(arrows, func(i, j int) int {
			ci, cj := center(other(i)), center(other(j))
			switch {
			case ci < cj:
				return -1
			case ci > cj:
				return 1
			}
			return 0
		})
		bx := boxes[n]
		for k, i := range arrows {
			set[i] = bx.x + bx.w*float64(k+1)/float64(len(arrows)+1)
		}
	}
	for n, arrows := range out {
		spread(n, arrows, func(i int) string { return g.arrows[i][1] }, startX)
	}
	for n, arrows := range in {
		spread(n, arrows, func(i int) string { a := g.arrows[i]; return a[len(a)-2] }, endX)
	}
	for ai, a := range g.arrows {
		// From the importer's bottom, through the middle of each waypoint,
		// to the imported package's top, leaving and entering vertically.
		type pt struct{ x, y float64 }
		var pts []pt
		for i, n := range a {
			bx := boxes[n]
			switch {
			case i == 0:
				pts = append(pts, pt{startX[ai], bx.y + boxH})
			case i == len(a)-1:
				pts = append(pts, pt{endX[ai], bx.y})
			default:
				pts = append(pts, pt{bx.x + bx.w/2, bx.y}, pt{bx.x + bx.w/2, bx.y + boxH})
			}
		}
		fmt.Fprintf(&b, `<path d="M%.1f,%.1f`, pts[0].x, pts[0].y)
		for i := 1; i < len(pts); i++ {
			p, q := pts[i-1], pts[i]
			if p.x == q.x {
				fmt.Fprintf(&b, ` L%.1f,%.1f`, q.x, q.y)
				continue
			}
			m := (p.y + q.y) / 2
			fmt.Fprintf(&b, ` C%.1f,%.1f %.1f,%.1f %.1f,%.1f`, p.x, m, q.x, m, q.x, q.y)
		}
		b.WriteString(`" fill="none" stroke="#555" stroke-width="1.2" marker-end="url(#arrow)"/>` + "\n")
	}
	for _, row := range g.floors {
		for _, n := range row {
			if waypoint(n) {
				continue
			}
			bx := boxes[n]
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" rx="5" fill="%s" stroke="#666"/>`+"\n",
				bx.x, bx.y, bx.w, boxH, fill(n))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n",
				bx.x+bx.w/2, bx.y+boxH/2+4.5, n)
		}
	}
	for i, n := range notes {
		fmt.Fprintf(&b, `<text x="12" y="%.0f" fill="#555" font-family="sans-serif">%s</text>`+"\n",
			foot+float64(i+1)*lineH, html.EscapeString(n))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
