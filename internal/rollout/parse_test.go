package rollout_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/internal/rollout"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    rollout.Settings
		wantErr string
	}{
		{`{"percent": 25}`, rollout.Settings{Percent: 25}, ""},
		{`{"percent": 0, "mirror": true}`, rollout.Settings{Percent: 0, Mirror: true}, ""},
		{" {\"mirror\": false, \"percent\": 100}\n", rollout.Settings{Percent: 100}, ""},
		{`{}`, rollout.Settings{}, `"percent" is missing`},
		{`{"mirror": true}`, rollout.Settings{}, `"percent" is missing`},
		{`{"percent": 101}`, rollout.Settings{}, "within [0, 100]"},
		{`{"percent": -1}`, rollout.Settings{}, "within [0, 100]"},
		{`{"percent": 12.5}`, rollout.Settings{}, "cannot unmarshal"},
		{`{"percent": "25"}`, rollout.Settings{}, "cannot unmarshal"},
		{`{"percnt": 25}`, rollout.Settings{}, "unknown field"},
		{`{"percent": 25}{"percent": 50}`, rollout.Settings{}, "data after"},
		{`{"percent": 25} x`, rollout.Settings{}, "data after"},
		{`[25]`, rollout.Settings{}, "want one JSON object, found an array"},
		{`null`, rollout.Settings{}, "want one JSON object, found null"},
		{`25`, rollout.Settings{}, "want one JSON object, found a number"},
		{`"percent"`, rollout.Settings{}, "want one JSON object, found a string"},
		{``, rollout.Settings{}, "the content is empty"},
		{" \n", rollout.Settings{}, "the content is empty"},
		{`{"percent": 25`, rollout.Settings{}, "unexpected EOF"},
		{`{"percent": 25,`, rollout.Settings{}, "unexpected EOF"},
		{`{"percent": `, rollout.Settings{}, "unexpected EOF"},
		{`{"percent" 25}`, rollout.Settings{}, "colon"},
		// Names are matched exactly, once each: encoding/json would take
		// all of these, the last value winning.
		{`{"PERCENT": 50}`, rollout.Settings{}, `field "PERCENT": names are case-sensitive; want "percent"`},
		{`{"Percent": 50}`, rollout.Settings{}, `want "percent"`},
		{`{"percent": 5, "Mirror": true}`, rollout.Settings{}, `field "Mirror": names are case-sensitive; want "mirror"`},
		{`{"percent": 5, "percent": 50}`, rollout.Settings{}, `field "percent" appears twice`},
		{`{"percent": 5, "percent": null}`, rollout.Settings{}, `field "percent" appears twice`},
		{`{"percent": 5, "mirror": true, "mirror": false}`, rollout.Settings{}, `field "mirror" appears twice`},
		{`{"perc\u0065nt": 5}`, rollout.Settings{Percent: 5}, ""}, // the name, unescaped, is exact
		{`{"percent": null}`, rollout.Settings{}, `"percent" is missing`},
		{`{"percent": 7, "mirror": null}`, rollout.Settings{Percent: 7}, ""},
		{`{"percent": 25, "mirror": 1}`, rollout.Settings{}, "cannot unmarshal"},
		{strings.Repeat(" ", rollout.MaxFileSize) + `{"percent": 1}`, rollout.Settings{}, "at most"},
	}
	for _, tt := range tests {
		name := tt.in
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run(name, func(t *testing.T) {
			got, err := rollout.Parse([]byte(tt.in))
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("Parse = %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, rollout.ErrSettings) || !strings.Contains(err.Error(), tt.wantErr) || strings.Count(err.Error(), "flags:") != 1 {
				t.Fatalf("Parse error = %v, want rollout.ErrSettings mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"percent": 25}`, `{"percent": 0, "mirror": true}`, `{}`, `{"percent": 1e2}`, `null`, `{"percent": 5}garbage`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := rollout.Parse(data)
		if err != nil {
			if !errors.Is(err, rollout.ErrSettings) {
				t.Fatalf("error %v does not match rollout.ErrSettings", err)
			}
			return
		}
		if s.Percent < 0 || s.Percent > 100 {
			t.Fatalf("accepted percent %d", s.Percent)
		}
		// What was accepted is what a source routes by.
		p, err := flags.NewPercent(s.Percent)
		if err != nil || p.Percent() != s.Percent {
			t.Fatalf("percent %d became %v, %v", s.Percent, p, err)
		}
	})
}
