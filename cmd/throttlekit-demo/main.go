// Command throttlekit-demo serves a small HTTP API limited by throttlekit on
// the embedded memory backend, to explore the headers, 429s and 304 refunds
// with curl.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	limit := flag.Int64("limit", 5, "requests per window for each client")
	window := flag.Duration("window", time.Minute, "window length")
	flag.Parse()
	if err := run(*addr, throttler.Policy{Name: "core", Limit: *limit, Window: *window}, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(addr string, p throttler.Policy, out io.Writer) error {
	h, err := newHandler(p, log.Default())
	if err != nil {
		return err // before listening: a bad -limit or -window stops here
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	printUsage(out, "http://"+ln.Addr().String(), p)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdown); err != nil {
			return err
		}
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

// newHandler is the demo API: /repos is limited by p and answers 304 to a
// matching If-None-Match (refunded), /rate_limit reports the window without
// counting, as GitHub's does. A policy that cannot work is an error here.
func newHandler(p throttler.Policy, logger *log.Logger) (http.Handler, error) {
	store, err := memory.New(&memory.Options{MaxKeys: 1_000_000})
	if err != nil {
		return nil, err
	}
	th, err := throttler.New(store, &throttler.Options{
		Observe: func(o throttler.Observation) {
			if o.Err != nil && !throttler.IsInputError(o.Err) {
				// Errors may hold the client's key: fine in the server's
				// log, never in a response.
				logger.Printf("rate limiter degraded (%v): %v", o.Source, o.Err)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	limited, err := th.Middleware(p, clientKey, &throttler.MiddlewareOptions{IETFHeaders: true})
	if err != nil {
		return nil, err
	}
	const etag = `"repos-v1"`
	repos := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode([]map[string]string{{"name": "throttlekit"}, {"name": "hello-world"}})
	})
	mux := http.NewServeMux()
	mux.Handle("GET /repos", limited(repos))
	mux.HandleFunc("GET /rate_limit", func(w http.ResponseWriter, r *http.Request) {
		k, err := clientKey(r)
		if err != nil {
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		d, err := th.Peek(r.Context(), k, p)
		switch {
		case throttler.IsInputError(err): // a key the store refuses: the client's to fix
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		case err != nil:
			http.Error(w, http.StatusText(http.StatusServiceUnavailable), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"resource": p.Name, "limit": d.Limit, "used": d.Used, "remaining": d.Remaining, "reset": d.ResetUnix(),
		})
	})
	return mux, nil
}

// clientKey names the client by its token ("Authorization: token X"), or by
// its IP address when it sends none. A real service would hash a token
// before it reaches a store (see throttler's ExampleKeyFunc_hashed).
func clientKey(r *http.Request) (string, error) {
	if auth := r.Header.Get("Authorization"); auth != "" {
		tok, ok := strings.CutPrefix(auth, "token ")
		if !ok || tok == "" {
			return "", errors.New(`the Authorization header must be "token <value>"`)
		}
		return "token:" + tok, nil
	}
	ip, err := throttler.KeyByRemoteIP(r)
	return "ip:" + ip, err
}

// tryStep is one command the demo prints: a request (repeated times times)
// and the status its last response gets when the commands run in order.
type tryStep struct {
	note   string
	header string // "Name: value", or ""
	path   string
	times  int64
	want   int
}

// trySteps are the commands to try, in an order in which each does what its
// note says for any limit: the 304 comes before a request that could spend
// a limit of 1, and the loop that spends a window comes last, on a client
// of its own.
func trySteps(p throttler.Policy) []tryStep {
	return []tryStep{
		{fmt.Sprintf("304: the unit is refunded, X-RateLimit-Remaining stays %d", p.Limit), `If-None-Match: "repos-v1"`, "/repos", 1, http.StatusNotModified},
		{fmt.Sprintf("200: X-RateLimit-Remaining falls to %d", p.Limit-1), "", "/repos", 1, http.StatusOK},
		{"the window, not counted", "", "/rate_limit", 1, http.StatusOK},
		{"400: a malformed key is the client's error", "Authorization: Basic xyz", "/repos", 1, http.StatusBadRequest},
		{fmt.Sprintf("another client, its own window: %d x 200, then 429 with Retry-After", p.Limit), "Authorization: token alice", "/repos", p.Limit + 1, http.StatusTooManyRequests},
	}
}

// command renders s as a shell command against base.
func (s tryStep) command(base string) string {
	h := ""
	if s.header != "" {
		h = "-H '" + s.header + "' "
	}
	if s.times > 1 {
		return fmt.Sprintf(`for i in $(seq %d); do curl -s -o /dev/null -w '%%{http_code}\n' %s%s%s; done`, s.times, h, base, s.path)
	}
	return fmt.Sprintf("curl -i %s%s%s", h, base, s.path)
}

func printUsage(w io.Writer, base string, p throttler.Policy) {
	fmt.Fprintf(w, "throttlekit demo listening on %s (policy %v, memory backend)\n\nTry it, in this order:\n", base, p)
	for _, s := range trySteps(p) {
		fmt.Fprintf(w, "  # %s\n  %s\n", s.note, s.command(base))
	}
	fmt.Fprintln(w, "\nCtrl-C stops it.")
}
