package main

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestCommittedPicture: docs/architecture.svg is what this program draws from
// the imports now. After adding a package or changing what one imports,
// regenerate it with `go -C benchmarks run ./cmd/archsvg -root .. > docs/architecture.svg`.
func TestCommittedPicture(t *testing.T) {
	const root = "../../.."
	committed, err := os.ReadFile(root + "/docs/architecture.svg")
	if err != nil {
		t.Fatal(err)
	}
	g, err := load(root)
	if err != nil {
		t.Fatal(err)
	}
	var now bytes.Buffer
	if err := render(&now, g); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, now.Bytes()) {
		t.Fatal("docs/architecture.svg is stale: run `go -C benchmarks run ./cmd/archsvg -root .. > docs/architecture.svg`")
	}
}

// TestLayout: floors by the longest path of imports, arrows only where no
// longer path joins two packages, a waypoint on each floor an arrow crosses,
// and what is left out.
func TestLayout(t *testing.T) {
	pkgs := map[string]*pkg{
		"":                    {rel: ""},
		"core":                {rel: "core", imports: []string{"internal/util"}},
		"kit":                 {rel: "kit", imports: []string{"core"}},
		"store":               {rel: "store", imports: []string{"core", "kit"}},
		"wrap":                {rel: "wrap", imports: []string{"kit", "core"}},
		"both":                {rel: "both", imports: []string{"store", "wrap", "core"}},
		"cmd/app":             {rel: "cmd/app", main: true, imports: []string{"both", "kit", "lone"}},
		"lone":                {rel: "lone"},
		"tools/gen":           {rel: "tools/gen", main: true, imports: []string{"core"}},
		"internal/util":       {rel: "internal/util"},
		"internal/cmd/draw":   {rel: "internal/cmd/draw", main: true},
		"wrap/internal/share": {rel: "wrap/internal/share", imports: []string{"core"}},
		"kit/internal/fake":   {rel: "kit/internal/fake", imports: []string{"kit"}},
		"top":                 {rel: "top", imports: []string{"wrap/internal/share", "kit"}},
	}
	g := layout(pkgs)
	var floors [][]string
	for _, row := range g.floors {
		var real []string
		for _, n := range row {
			if !strings.HasPrefix(n, "~") {
				real = append(real, n)
			}
		}
		slices.Sort(real)
		floors = append(floors, real)
	}
	wantFloors := [][]string{
		{"core", "lone"},
		{"kit", "wrap/internal/share"},
		{"store", "top", "wrap"},
		{"both"},
		{"cmd/app"},
	}
	if !slices.EqualFunc(floors, wantFloors, slices.Equal) {
		t.Errorf("floors = %q, want %q", floors, wantFloors)
	}
	var arrows []string
	for _, a := range g.arrows {
		arrows = append(arrows, a[0]+">"+a[len(a)-1]+" via "+strings.Join(a[1:len(a)-1], ","))
	}
	slices.Sort(arrows)
	wantArrows := []string{
		"both>store via ",
		"both>wrap via ",
		"cmd/app>both via ",
		"cmd/app>lone via ~cmd/app>lone@3,~cmd/app>lone@2,~cmd/app>lone@1",
		"kit>core via ",
		"store>kit via ",
		"top>kit via ", // wrap/internal/share is not on top's path to kit
		"top>wrap/internal/share via ",
		"wrap/internal/share>core via ",
		"wrap>kit via ",
	}
	if !slices.Equal(arrows, wantArrows) {
		t.Errorf("arrows =\n%q\nwant\n%q", arrows, wantArrows)
	}
	if want := []string{"internal/util"}; !slices.Equal(g.hidden, want) {
		t.Errorf("hidden = %q, want %q", g.hidden, want)
	}
}

// TestLayoutInternal: a package of the top-level internal/ that imports the
// module is drawn when a drawn package imports it, through another internal
// package too; one that imports only helpers is a helper; one only tests
// import is left out.
func TestLayoutInternal(t *testing.T) {
	pkgs := map[string]*pkg{
		"core":            {rel: "core"},
		"internal/util":   {rel: "internal/util"},
		"internal/fmtx":   {rel: "internal/fmtx", imports: []string{"internal/util"}},
		"internal/num":    {rel: "internal/num", imports: []string{"core"}},
		"internal/arith":  {rel: "internal/arith", imports: []string{"internal/num", "internal/fmtx"}},
		"internal/probe":  {rel: "internal/probe", imports: []string{"core"}},
		"store":           {rel: "store", imports: []string{"core", "internal/arith"}},
		"internal/cmd/go": {rel: "internal/cmd/go", main: true, imports: []string{"store"}},
	}
	g := layout(pkgs)
	var floors [][]string
	for _, row := range g.floors {
		floors = append(floors, slices.Clone(row))
	}
	wantFloors := [][]string{{"core"}, {"internal/num"}, {"internal/arith"}, {"store"}}
	if !slices.EqualFunc(floors, wantFloors, slices.Equal) {
		t.Errorf("floors = %q, want %q", floors, wantFloors)
	}
	var arrows []string
	for _, a := range g.arrows {
		arrows = append(arrows, a[0]+">"+a[len(a)-1])
	}
	slices.Sort(arrows)
	if want := []string{"internal/arith>internal/num", "internal/num>core", "store>internal/arith"}; !slices.Equal(arrows, want) {
		t.Errorf("arrows = %q, want %q", arrows, want)
	}
	if want := []string{"internal/fmtx", "internal/util"}; !slices.Equal(g.hidden, want) {
		t.Errorf("hidden = %q, want %q", g.hidden, want)
	}
}
