package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocsManual: docs/cli.md ends with the manual as the program prints
// it; -update rewrites that part.
func TestDocsManual(t *testing.T) {
	var b bytes.Buffer
	te := newTestEnv(t)
	b.WriteString("\n### throttlekit\n\n```text\n")
	te.printMain(&b)
	b.WriteString("```\n")
	for _, c := range commands() {
		b.WriteString("\n### throttlekit " + c.name + "\n\n```text\n")
		te.printPages(&b, c.name)
		b.WriteString("```\n")
	}
	const begin, end = "<!-- manual:begin -->\n", "<!-- manual:end -->"
	path := filepath.Join("..", "..", "docs", "cli.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i, j := bytes.Index(doc, []byte(begin)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q", path, strings.TrimSpace(begin), end)
	}
	got := doc[i+len(begin) : j]
	want := append(b.Bytes(), '\n')
	if bytes.Equal(got, want) {
		return
	}
	if *update {
		out := append(append(append([]byte{}, doc[:i+len(begin)]...), want...), doc[j:]...)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("the manual in %s is not what the program prints; run go test -run TestDocsManual -update", path)
}
