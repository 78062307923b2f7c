package unleash

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	unleashsdk "github.com/Unleash/unleash-client-go/v4"

	"github.com/throttlekit/throttlekit/flags/internal/flagstest"
)

var testKeys = flagstest.Keys

// source is New for arguments the test knows are valid.
func source(t testing.TB, c *unleashsdk.Client, feature string, opts *Options) *Rollout {
	t.Helper()
	s, err := New(c, feature, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeUnleash serves /api/client/features on loopback from an in-memory list
// that tests change, so the real client evaluates offline.
type fakeUnleash struct {
	mu       sync.Mutex
	features []map[string]any
	rev      int
	srv      *httptest.Server
}

func newFakeUnleash(t testing.TB) *fakeUnleash {
	t.Helper()
	f := &fakeUnleash{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/client/features" {
			w.WriteHeader(http.StatusAccepted) // registration and metrics
			return
		}
		f.mu.Lock()
		body, _ := json.Marshal(map[string]any{"version": 2, "features": f.features})
		etag := `"` + strconv.Itoa(f.rev) + `"`
		f.mu.Unlock()
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Etag", etag)
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// flexible is a feature with one flexibleRollout strategy on userId.
func flexible(name, groupID string, rollout int) map[string]any {
	return map[string]any{
		"name": name, "enabled": true,
		"strategies": []any{map[string]any{
			"name":       "flexibleRollout",
			"parameters": map[string]any{"rollout": strconv.Itoa(rollout), "stickiness": "userId", "groupId": groupID},
		}},
	}
}

func (f *fakeUnleash) set(features ...map[string]any) {
	f.mu.Lock()
	f.features = features
	f.rev++
	f.mu.Unlock()
}

// readyListener signals fetched definitions.
type readyListener struct {
	updated chan struct{}
}

func (l *readyListener) OnError(error)   {}
func (l *readyListener) OnWarning(error) {}
func (l *readyListener) OnReady()        { l.signal() }
func (l *readyListener) OnUpdate()       { l.signal() }
func (l *readyListener) signal() {
	select {
	case l.updated <- struct{}{}:
	default:
	}
}

// client starts a real Unleash client against f; wait blocks until its
// next fetch with changes (or fails the test after a bounded wait).
func (f *fakeUnleash) client(t testing.TB, refresh time.Duration) (c *unleashsdk.Client, wait func()) {
	t.Helper()
	l := &readyListener{updated: make(chan struct{}, 1)}
	c, err := unleashsdk.NewClient(
		unleashsdk.WithUrl(f.srv.URL+"/api"),
		unleashsdk.WithAppName("flags-unleash-test"),
		unleashsdk.WithRefreshInterval(refresh),
		unleashsdk.WithDisableMetrics(false), unleashsdk.WithMetricsInterval(time.Hour),
		unleashsdk.WithBackupPath(t.TempDir()),
		unleashsdk.WithListener(l),
	)
	if err != nil {
		t.Fatalf("unleash client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, func() {
		t.Helper()
		select {
		case <-l.updated:
		case <-time.After(10 * time.Second):
			t.Fatal("unleash client fetched nothing within 10s")
		}
	}
}
