package unleash

import (
	"testing"
	"time"

	unleashsdk "github.com/Unleash/unleash-client-go/v4"
	ucontext "github.com/Unleash/unleash-client-go/v4/context"

	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/flags/internal/flagstest"
)

func benchClient(b *testing.B, rollout int) *unleashsdk.Client {
	f := newFakeUnleash(b)
	f.set(flexible("feat", "feat", rollout))
	c, wait := f.client(b, time.Hour)
	wait()
	return c
}

// BenchmarkRouterTake is flags' BenchmarkRouterTake with this source: the
// Router's added cost per call is "unleash" minus "direct".
func BenchmarkRouterTake(b *testing.B) {
	r, err := flags.NewRouter(&flagstest.Nop{}, &flagstest.Nop{}, source(b, benchClient(b, 50), "feat", nil), nil)
	if err != nil {
		b.Fatal(err)
	}
	flagstest.BenchTake(b, "direct", &flagstest.Nop{})
	flagstest.BenchTake(b, "unleash", r)
}

// BenchmarkClientIsEnabled is the client's own per-call cost (with its
// metrics on, as in production): the reason the source evaluates from the
// client's definitions instead.
func BenchmarkClientIsEnabled(b *testing.B) {
	c := benchClient(b, 50)
	keys := flagstest.BenchKeys()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.IsEnabled("feat", unleashsdk.WithContext(ucontext.Context{UserId: keys[i&1023]}))
	}
}
