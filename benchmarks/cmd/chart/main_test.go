package main

import (
	"encoding/xml"
	"io"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkRedisBatchScaling/goroutines=1-2   3   1 ns/op   100 a-calls/s   50 b-calls/s   2.0 a/b
BenchmarkRedisBatchScaling/goroutines=1-2   3   1 ns/op   300 a-calls/s   70 b-calls/s   4.3 a/b
BenchmarkRedisBatchScaling/goroutines=1-2   3   1 ns/op   200 a-calls/s   60 b-calls/s   3.3 a/b
BenchmarkRedisBatchScaling/goroutines=64-2  3   1 ns/op   9000 a-calls/s  1000 b-calls/s  9 a/b
BenchmarkOther/goroutines=64-2  3   1 ns/op   1 a-calls/s
PASS
`

func TestParseTakesMedians(t *testing.T) {
	s, err := parse(strings.NewReader(sample), "BenchmarkRedisBatchScaling")
	if err != nil {
		t.Fatal(err)
	}
	want := series{"a": {1: 200, 64: 9000}, "b": {1: 60, 64: 1000}}
	for name, pts := range want {
		for g, v := range pts {
			if got := s[name][g]; got != v {
				t.Errorf("%s at %d: %v, want %v", name, g, got, v)
			}
		}
	}
	if len(s) != 2 || len(s["a"]) != 2 {
		t.Errorf("parsed %v", s)
	}
}

func TestParseRejectsABadCount(t *testing.T) {
	if _, err := parse(strings.NewReader("BenchmarkX/goroutines=x-2 1 1 ns/op 5 a-calls/s\n"), "BenchmarkX"); err == nil {
		t.Error("no error")
	}
}

func TestDrawIsWellFormedSVG(t *testing.T) {
	s, err := parse(strings.NewReader(sample), "BenchmarkRedisBatchScaling")
	if err != nil {
		t.Fatal(err)
	}
	out := draw(s, "a <title> & more")
	d := xml.NewDecoder(strings.NewReader(out))
	lines := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v", err)
		}
		if e, ok := tok.(xml.StartElement); ok && e.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 2 {
		t.Errorf("%d polylines, want one per series", lines)
	}
}
