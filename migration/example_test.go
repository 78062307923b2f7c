package migration_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/migration"
	"github.com/throttlekit/throttlekit/throttler"
)

// A migration from one store to another, ramped and rolled back by a static
// percentage. In production the stores are Memcached and Redis, and the
// rollout is a flags.File or an unleash.Rollout (package flags/unleash) that
// an operator changes.
func Example() {
	ctx := context.Background()
	p := throttler.Policy{Name: "api", Limit: 3, Window: time.Minute}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	old, err := memory.New(nil) // in production: Memcached
	if err != nil {
		panic(err)
	}
	next, err := memory.New(nil) // in production: Redis
	if err != nil {
		panic(err)
	}
	rollout, err := flags.NewPercent(0)
	if err != nil {
		panic(err)
	}
	rollout.SetMirror(true) // stage 1: old serves, new is compared
	m, err := migration.New(old, next, rollout, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	t, err := throttler.New(m, &throttler.Options{Clock: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}

	take := func() bool { d, _ := t.Allow(ctx, "alice", p); return d.Allowed }
	fmt.Println("0%:", take(), take())
	_ = m.Flush(ctx)

	// alice moves to the new store. For a while (Options.Settle plus two
	// windows) her calls go to both stores, so neither a call the mirror
	// dropped nor another process still on the old store can give her a
	// fresh window.
	_ = rollout.Set(100)
	fmt.Println("100%:", take(), take())

	_ = rollout.Set(0) // rollback: still on both stores, still exact
	fmt.Println("rollback:", take())
	_ = m.Flush(ctx)

	st := m.Stats()
	fmt.Printf("forward compared %d, mismatches %d; moving keys' calls %d, answered by one store %d\n",
		st.Forward.Compared, st.Forward.Mismatched, st.Moving.Calls, st.Moving.OneStore)
	// Output:
	// 0%: true true
	// 100%: true false
	// rollback: false
	// forward compared 2, mismatches 0; moving keys' calls 3, answered by one store 0
}
