package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler"
)

// migratingSource starts two Redis Cluster nodes, gives every slot to the
// first, and returns a client of it: migrate(sk) sets the slot of storage
// key sk MIGRATING to the second node, as a reshard does before it moves
// the slot's keys, so that a script on sk finds it local until it is gone.
func migratingSource(t *testing.T) (src *goredis.Client, migrate func(sk string)) {
	t.Helper()
	a, _ := startRedis(t, "--cluster-enabled", "yes")
	b, portB := startRedis(t, "--cluster-enabled", "yes")
	ctx := context.Background()
	if err := a.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(portB)).Err(); err != nil {
		t.Fatal(err)
	}
	idB, err := b.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // the handshake: a must know b before it migrates to it
		nodes, err := a.ClusterNodes(ctx).Result()
		info, _ := a.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(nodes, idB) && !strings.Contains(nodes, "handshake") &&
			strings.Contains(info, "cluster_state:ok") {
			break
		} else if i == 500 {
			t.Fatalf("node b never joined or the cluster is not ok: %q, %q, %v", nodes, info, err)
		}
		time.Sleep(10 * time.Millisecond) // the servers' gossip, not the clock
	}
	return a, func(sk string) {
		slot, err := a.ClusterKeySlot(ctx, sk).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", idB).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// A reshard sets a slot MIGRATING on its source, then moves its keys; a
// command there on a key it no longer holds is refused (ASK), and a script
// that deleted its key (a sorted set it emptied) and then wrote it again
// failed part way: "Script attempted to access a non local key", after the
// delete. The Take failed, the Throttler failed open, and the unit was
// never counted. No script touches a key after a command that may have
// deleted it: each call below runs on the source, as its key is still
// there.
func TestScriptsOnAMigratingSlot(t *testing.T) {
	src, migrate := migratingSource(t)
	b := newBackend(t, src, nil)
	ctx := context.Background()

	log := throttler.Policy{Name: "log", Limit: 2, Window: time.Second, Algorithm: throttler.SlidingLog}
	if _, err := b.Take(ctx, "k", log, 1, t0); err != nil {
		t.Fatal(err)
	}
	sk, _ := b.keyOf(log, "k")
	migrate(sk)
	// Every unit ended: the drop empties the log, then the Take logs its own.
	d, err := b.Take(ctx, "k", log, 1, t0.Add(log.Window))
	if err != nil || !d.Allowed || d.Used != 1 {
		t.Errorf("sliding log, every unit ended: %+v, %v; want admitted, Used 1", d, err)
	}

	lease := throttler.ConcurrencyPolicy{Name: "jobs", Limit: 3, TTL: time.Second}
	for _, key := range []string{"acquire", "release"} {
		if _, err := b.Acquire(ctx, key, lease, 1, t0); err != nil {
			t.Fatal(err)
		}
		sk, _ := b.leaseKey(lease, key)
		migrate(sk)
	}
	// Every lease expired: the drop empties the set.
	d, err = b.Acquire(ctx, "acquire", lease, 2, t0.Add(lease.TTL))
	if err != nil || !d.Allowed || d.Used != 1 {
		t.Errorf("Acquire, every lease expired: %+v, %v; want admitted, Used 1", d, err)
	}
	held, d, err := b.Release(ctx, "release", lease, 1, t0.Add(lease.TTL))
	if err != nil || held || d.Used != 0 {
		t.Errorf("Release, every lease expired: held %v, %+v, %v; want not held, Used 0", held, d, err)
	}
}

// A composite on the source of a MIGRATING slot runs there while every
// member's key is there; when some are and some are not (a key moved, or
// none yet), Redis refuses the script before it runs (TRYAGAIN): the
// backend sends it once more, then fails the call as the key's failure
// (its slot is moving; its server is fine), nothing counted.
func TestCompositeOnAMigratingSlot(t *testing.T) {
	src, migrate := migratingSource(t)
	b := newBackend(t, src, &Options{TagByKey: true})
	ctx := context.Background()
	log := throttler.Policy{Name: "log", Limit: 3, Window: time.Second, Algorithm: throttler.SlidingLog}
	win := throttler.Policy{Name: "win", Limit: 3, Window: time.Second}
	c := throttler.All(log, win)
	for _, key := range []string{"both", "one"} {
		if _, err := b.Take(ctx, key, log, 1, t0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Take(ctx, "both", win, 1, t0); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"both", "one"} {
		sk, _ := b.keyOf(log, key)
		migrate(sk)
	}
	d, err := b.Take(ctx, "both", c, 1, t0)
	if err != nil || !d.Allowed || d.Used != 2 {
		t.Errorf("every key on the source: %+v, %v; want admitted, Used 2", d, err)
	}
	_, err = b.Take(ctx, "one", c, 1, t0)
	if !errors.Is(err, throttler.ErrKeyState) || errors.Is(err, throttler.ErrUnavailable) ||
		!strings.Contains(fmt.Sprint(err), "TRYAGAIN") {
		t.Errorf("a key missing on the source: %v; want the key's failure, TRYAGAIN", err)
	}
	if d, err := b.Peek(ctx, "one", log, t0); err != nil || d.Used != 1 {
		t.Errorf("the refused composite counted: %+v, %v", d, err)
	}
}
