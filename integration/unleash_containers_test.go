package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Tokens the Unleash server creates at start (INIT_*_API_TOKENS), in its
// "project:environment.secret" format.
const (
	unleashAdminToken  = "*:*.throttlekit-admin"
	unleashClientToken = "default:development.throttlekit-client"
	unleashEnv         = "development"
)

// unleashServer is a running Unleash with its PostgreSQL, on a user-defined
// Docker network of their own.
type unleashServer struct {
	URL       string // http://127.0.0.1:port, the published API port
	container *testcontainers.DockerContainer
}

// unleashStart starts PostgreSQL 15 and Unleash 6 and waits (bounded) until
// Unleash answers. Everything is removed when t ends.
func unleashStart(t *testing.T) *unleashServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	nw, err := network.New(ctx)
	if err != nil {
		t.Fatalf("unleash: network: %v", err)
	}
	testcontainers.CleanupNetwork(t, nw)

	db, err := testcontainers.Run(ctx, "postgres:15",
		containerLogger(t),
		network.WithNetwork([]string{"unleash-db"}, nw),
		testcontainers.WithEnv(map[string]string{"POSTGRES_PASSWORD": "unleash", "POSTGRES_DB": "unleash"}),
		testcontainers.WithExposedPorts("5432/tcp"),
		// initdb's temporary server logs it once, the real server again.
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").
			WithOccurrence(2).WithStartupTimeout(90*time.Second)),
	)
	testcontainers.CleanupContainer(t, db)
	if err != nil {
		t.Fatalf("unleash: postgres: %v", err)
	}

	srv, err := testcontainers.Run(ctx, "unleashorg/unleash-server:6",
		containerLogger(t),
		network.WithNetwork([]string{"unleash"}, nw),
		testcontainers.WithEnv(map[string]string{
			"DATABASE_URL":           "postgres://postgres:unleash@unleash-db:5432/unleash",
			"DATABASE_SSL":           "false",
			"INIT_ADMIN_API_TOKENS":  unleashAdminToken,
			"INIT_CLIENT_API_TOKENS": unleashClientToken,
			"LOG_LEVEL":              "warn",
		}),
		testcontainers.WithExposedPorts("4242/tcp"),
		// Migrations run before the API answers: slow on 2 cores.
		testcontainers.WithWaitStrategy(wait.ForHTTP("/health").WithPort("4242/tcp").
			WithStartupTimeout(150*time.Second).WithPollInterval(500*time.Millisecond)),
	)
	testcontainers.CleanupContainer(t, srv)
	if err != nil {
		t.Fatalf("unleash: server: %v", err)
	}
	url, err := srv.PortEndpoint(ctx, "4242/tcp", "http")
	if err != nil {
		t.Fatalf("unleash: endpoint: %v", err)
	}
	return &unleashServer{URL: url, container: srv}
}

// unleashAdmin calls the Admin API and decodes the JSON answer into out
// (when not nil).
func (u *unleashServer) unleashAdmin(t *testing.T, method, path string, body, out any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u.URL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", unleashAdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("unleash admin %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("unleash admin %s %s: %s: %s", method, path, resp.Status, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("unleash admin %s %s: %v in %s", method, path, err, data)
		}
	}
}

// unleashRollout is a feature with one flexibleRollout strategy on userId,
// whose percentage the test changes through the Admin API.
type unleashRollout struct {
	srv        *unleashServer
	feature    string
	strategyID string
}

// unleashCreateRollout creates feature with a flexibleRollout of percent on
// userId (groupId: the feature's name) and enables it.
func (u *unleashServer) unleashCreateRollout(t *testing.T, feature string, percent int) *unleashRollout {
	t.Helper()
	base := "/api/admin/projects/default/features"
	u.unleashAdmin(t, http.MethodPost, base, map[string]any{"name": feature, "type": "release"}, nil)
	var st struct {
		ID string `json:"id"`
	}
	u.unleashAdmin(t, http.MethodPost, fmt.Sprintf("%s/%s/environments/%s/strategies", base, feature, unleashEnv),
		unleashStrategy(feature, percent), &st)
	u.unleashAdmin(t, http.MethodPost, fmt.Sprintf("%s/%s/environments/%s/on", base, feature, unleashEnv), nil, nil)
	return &unleashRollout{srv: u, feature: feature, strategyID: st.ID}
}

func unleashStrategy(feature string, percent int) map[string]any {
	return map[string]any{
		"name": "flexibleRollout",
		"parameters": map[string]string{
			"rollout": fmt.Sprint(percent), "stickiness": "userId", "groupId": feature,
		},
	}
}

// set changes the rollout's percentage.
func (r *unleashRollout) set(t *testing.T, percent int) {
	t.Helper()
	r.srv.unleashAdmin(t, http.MethodPut,
		fmt.Sprintf("/api/admin/projects/default/features/%s/environments/%s/strategies/%s", r.feature, unleashEnv, r.strategyID),
		unleashStrategy(r.feature, percent), nil)
}

// unleashPublished returns the rollout percentage that the client API now
// serves for feature (the first strategy's), or -1 when it serves none.
func (u *unleashServer) unleashPublished(feature string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.URL+"/api/client/features", nil)
	if err != nil {
		return -1, err
	}
	req.Header.Set("Authorization", unleashClientToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1, err
	}
	defer resp.Body.Close()
	var body struct {
		Features []struct {
			Name       string `json:"name"`
			Strategies []struct {
				Parameters map[string]any `json:"parameters"`
			} `json:"strategies"`
		} `json:"features"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return -1, fmt.Errorf("unleash client API: %w", err)
	}
	for _, f := range body.Features {
		if f.Name == feature && len(f.Strategies) > 0 {
			var p int
			_, err := fmt.Sscan(fmt.Sprint(f.Strategies[0].Parameters["rollout"]), &p)
			return p, err
		}
	}
	return -1, nil
}
