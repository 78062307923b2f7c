package flags_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/flags"
	"github.com/throttlekit/throttlekit/throttler"
)

func Example() {
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	policy := throttler.PerHour(5000).Named("api")

	old, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	next, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	pct, err := flags.NewPercent(0) // every key on old until Set
	if err != nil {
		panic(err)
	}
	router, err := flags.NewRouter(old, next, pct, nil)
	if err != nil {
		panic(err)
	}

	take := func() {
		for i := range 1000 {
			router.Take(ctx, fmt.Sprintf("client-%d", i), policy, 1, now)
		}
	}
	take()
	fmt.Printf("0%%:  old %d, new %d\n", router.Stats().Old, router.Stats().New)

	pct.Set(25) // ramp: a quarter of the clients move on their next call
	take()
	fmt.Printf("25%%: old %d, new %d\n", router.Stats().Old, router.Stats().New)

	pct.Set(0) // rollback: every client is back on the old backend
	take()
	fmt.Printf("0%%:  old %d, new %d\n", router.Stats().Old, router.Stats().New)
	// Output:
	// 0%:  old 1000, new 0
	// 25%: old 1751, new 249
	// 0%:  old 2751, new 249
}

func ExampleNewFile() {
	path := filepath.Join(os.TempDir(), "throttlekit-example-rollout.json")
	defer os.Remove(path)
	os.WriteFile(path, []byte(`{"percent": 10, "mirror": true}`), 0o644)

	src, err := flags.NewFile(path, &flags.FileOptions{
		GroupID: "ratelimit-redis", // the Unleash feature that may take over later
		OnError: func(err error) { fmt.Println("keeping the last good settings:", err) },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer src.Close()
	fmt.Printf("percent=%d mirroring=%v\n", src.Percent(), src.Mirroring())

	os.WriteFile(path, []byte(`{"percent": 0}`), 0o644) // rollback
	src.Reload()                                        // the periodic check would find it within Interval
	fmt.Printf("percent=%d mirroring=%v\n", src.Percent(), src.Mirroring())
	// Output:
	// percent=10 mirroring=true
	// percent=0 mirroring=false
}
