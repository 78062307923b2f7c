package flags

import (
	"strconv"
	"testing"
	"time"
)

func BenchmarkUnleashUseNew(b *testing.B) {
	f := newFakeUnleash(b)
	f.set(flexible("feat", "feat", 50))
	c, wait := f.client(b, time.Hour)
	wait()
	u := NewUnleash(c, "feat", nil)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		u.UseNew(keys[i&1023])
	}
}

func BenchmarkUnleashUseNewParallel(b *testing.B) {
	f := newFakeUnleash(b)
	f.set(flexible("feat", "feat", 50))
	c, wait := f.client(b, time.Hour)
	wait()
	u := NewUnleash(c, "feat", nil)
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			u.UseNew("user-" + strconv.Itoa(i&1023))
			i++
		}
	})
}
