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
	if err := p.Validate(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: newHandler(p, log.Default()), ReadHeaderTimeout: 5 * time.Second}
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
// counting, as GitHub's does.
func newHandler(p throttler.Policy, logger *log.Logger) http.Handler {
	th := throttler.New(memory.New(&memory.Options{MaxKeys: 1_000_000}), &throttler.Options{
		Observe: func(o throttler.Observation) {
			if o.Err != nil && !throttler.IsInputError(o.Err) {
				logger.Printf("rate limiter degraded (%v): %v", o.Source, o.Err)
			}
		},
	})
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
	mux.Handle("GET /repos", th.Middleware(p, clientKey, &throttler.MiddlewareOptions{IETFHeaders: true})(repos))
	mux.HandleFunc("GET /rate_limit", func(w http.ResponseWriter, r *http.Request) {
		k, err := clientKey(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		d, err := th.Peek(r.Context(), k, p)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"resource": p.Name, "limit": d.Limit, "used": d.Used, "remaining": d.Remaining, "reset": d.ResetUnix(),
		})
	})
	return mux
}

// clientKey names the client by its token ("Authorization: token X"), or by
// its IP address when it sends none.
func clientKey(r *http.Request) (string, error) {
	if auth := r.Header.Get("Authorization"); auth != "" {
		tok, ok := strings.CutPrefix(auth, "token ")
		if !ok || tok == "" {
			return "", fmt.Errorf("%w: Authorization must be \"token <value>\"", throttler.ErrNoKey)
		}
		return "token:" + tok, nil
	}
	ip, err := throttler.KeyByRemoteIP(r)
	return "ip:" + ip, err
}

func printUsage(w io.Writer, base string, p throttler.Policy) {
	fmt.Fprintf(w, `throttlekit demo listening on %[1]s (policy %[2]v, memory backend)

Try it:
  curl -i %[1]s/repos                                   # watch X-RateLimit-Remaining fall
  for i in $(seq %[3]d); do curl -s -o /dev/null -w '%%{http_code}\n' %[1]s/repos; done   # then 429 with Retry-After
  curl -i -H 'If-None-Match: "repos-v1"' %[1]s/repos    # 304: the unit is refunded
  curl -i -H 'Authorization: token alice' %[1]s/repos   # another client, its own window
  curl -s %[1]s/rate_limit                              # the window, not counted

Ctrl-C stops it.
`, base, p, p.Limit+1)
}
