package httplimit_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeEmbedIt: the code of the README's "Embed it" (its import block
// aside) is Example_embed's, line for line, so the README shows code that
// compiles and runs.
func TestReadmeEmbedIt(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Embed it\n")
	_, code, ok2 := strings.Cut(section, "```go\n")
	code, _, ok3 := strings.Cut(code, "```\n")
	_, code, ok4 := strings.Cut(code, "\n)\n") // after the import block
	if !ok || !ok2 || !ok3 || !ok4 {
		t.Fatal(`README.md has no "## Embed it" section with a Go block that imports`)
	}
	var indented []string
	for _, line := range strings.Split(strings.Trim(code, "\n"), "\n") {
		if line != "" {
			line = "\t" + line
		}
		indented = append(indented, line)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Join(indented, "\n"); !strings.Contains(string(example), want) {
		t.Errorf("Example_embed no longer holds the README's code:\n%s", want)
	}
}
