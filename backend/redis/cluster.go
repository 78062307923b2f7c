package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// A Redis Cluster is one store per master (docs/backends-redis.md,
// "A Cluster: a store per master"). A shard whose primary is a
// *goredis.ClusterClient names each call's store after the master that
// serves the key's slot, from a slot map it keeps (masters), and gives each
// master a lane of its own, so that a stalled master holds up neither the
// breakers nor the batches of keys on the others. The client still routes
// every command: the map only names stores and picks lanes, and a stale map
// costs a misnamed store for a moment, never a misrouted command.
//
// A slot in the middle of a move (TRYAGAIN, ASK or MOVED left over after
// go-redis's redirections, CLUSTERDOWN for a slot no node serves) is the
// key's condition, not its master's: the call is tried again with a short
// backoff while its deadline allows (settle), and then fails as the key's
// failure (keyFailure), which no breaker counts.

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// slotMapEvery is how old the slot map may get before a call starts
// reloading it, and how long after a failed load the next may start.
// A redirection a call meets reloads it sooner, slotMapAfterMove after the
// last load began: a slot in a move gives one at every try.
const (
	slotMapEvery     = time.Second
	slotMapAfterMove = 100 * time.Millisecond
)

// slotMapTimeout bounds one load of the slot map.
const slotMapTimeout = time.Second

// Slot-move retries: the first wait, the longest, and how long a call
// without a deadline keeps trying (a Throttler's calls always have one,
// its Timeout).
const (
	firstSlotWait = time.Millisecond
	maxSlotWait   = 8 * time.Millisecond
	slotPatience  = 100 * time.Millisecond
)

// masters names a Cluster's masters by slot and holds a lane per master.
// It keeps no goroutine: a call that finds the map old starts one load,
// which ends when CLUSTER SHARDS answers or times out.
type masters struct {
	cc       *goredis.ClusterClient
	fallback *lane     // the shard's own lane, named for the whole Cluster: no map yet
	start    time.Time // the origin of the monotonic instants below

	table    atomic.Pointer[slotTable]
	loading  atomic.Bool
	lastLoad atomic.Int64 // ns since start when the last load began
	stale    atomic.Bool  // a redirection was seen: reload at the next call

	lanes   atomic.Pointer[map[string]*lane] // by store name; replaced, never changed
	lanesMu sync.Mutex
}

// slotTable is one reading of the slot map: each slot's master as an
// index into names, plus one; 0 for a slot no master serves.
type slotTable struct {
	master [clusterSlots]uint16
	names  []string
}

func newMasters(cc *goredis.ClusterClient, fallback *lane) *masters {
	m := &masters{cc: cc, fallback: fallback, start: time.Now()}
	m.lastLoad.Store(-int64(slotMapEvery))
	m.lanes.Store(&map[string]*lane{})
	return m
}

// masterName is a master's store name: stable for as long as its address.
func masterName(addr string) string { return "redis master " + addr }

// store names the master that serves slot, or the whole Cluster (the
// shard's own name) until the map is first loaded or for a slot that no
// master serves. It does no I/O, and leaves loading the map to the calls.
func (m *masters) store(slot uint16) string {
	if name := m.master(slot); name != "" {
		return name
	}
	return m.fallback.store
}

// master is the name of the master that serves slot, or "".
func (m *masters) master(slot uint16) string {
	t := m.table.Load()
	if t == nil || t.master[slot] == 0 {
		return ""
	}
	return t.names[t.master[slot]-1]
}

// laneOf is the lane of the master that serves slot (see store). A call
// that finds the map old starts a load (maybeLoad), in the background.
func (m *masters) laneOf(slot uint16) *lane {
	m.maybeLoad()
	name := m.master(slot)
	if name == "" {
		return m.fallback
	}
	if l, ok := (*m.lanes.Load())[name]; ok {
		return l
	}
	return m.addLane(name)
}

func (m *masters) addLane(name string) *lane {
	m.lanesMu.Lock()
	defer m.lanesMu.Unlock()
	old := *m.lanes.Load()
	if l, ok := old[name]; ok {
		return l
	}
	lanes := make(map[string]*lane, len(old)+1)
	for k, v := range old {
		lanes[k] = v
	}
	l := m.newLane(name)
	lanes[name] = l
	m.lanes.Store(&lanes)
	return l
}

// newLane is a lane of the Cluster's client for the master named store,
// set as the shard's own lane was when the Backend was built.
func (m *masters) newLane(store string) *lane {
	f := m.fallback
	l := newLane(m.cc, f.max, f.stats)
	l.store, l.dials, l.wait = store, f.dials, f.wait
	l.always, l.slots, l.batches = f.always, f.slots, f.batches
	return l
}

// maybeLoad starts a load of the map when the last one began slotMapEvery
// ago, or slotMapAfterMove ago and a redirection was seen since, unless
// one is under way.
func (m *masters) maybeLoad() {
	now := int64(time.Since(m.start))
	age := now - m.lastLoad.Load()
	if age < int64(slotMapAfterMove) || age < int64(slotMapEvery) && !m.stale.Load() {
		return
	}
	if !m.loading.CompareAndSwap(false, true) {
		return
	}
	m.stale.Store(false)
	m.lastLoad.Store(now)
	go m.load()
}

// load reads the Cluster's slot map into a new table; a failure keeps the
// old one.
func (m *masters) load() {
	defer m.loading.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), slotMapTimeout)
	defer cancel()
	ranges, err := slotRanges(ctx, m.cc)
	if err != nil {
		return
	}
	m.table.Store(newSlotTable(ranges, m.table.Load()))
}

// slotRange is a range of slots and the address of its master.
type slotRange struct {
	start, end int64
	addr       string
}

// slotRanges reads the slot map with CLUSTER SHARDS, or with CLUSTER SLOTS
// from a Redis before 7.0, which answers the former with an error.
func slotRanges(ctx context.Context, cc *goredis.ClusterClient) ([]slotRange, error) {
	shards, err := cc.ClusterShards(ctx).Result()
	var re goredis.Error
	if errors.As(err, &re) {
		return legacySlotRanges(ctx, cc)
	}
	if err != nil {
		return nil, err
	}
	var out []slotRange
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role != "master" {
				continue
			}
			host, port := n.Endpoint, n.Port
			if host == "" || host == "?" {
				host = n.IP
			}
			if port == 0 {
				port = n.TLSPort
			}
			for _, r := range sh.Slots {
				out = append(out, slotRange{r.Start, r.End, net.JoinHostPort(host, strconv.FormatInt(port, 10))})
			}
		}
	}
	return out, nil
}

func legacySlotRanges(ctx context.Context, cc *goredis.ClusterClient) ([]slotRange, error) {
	//lint:ignore SA1019 the slot map of a Redis before 7.0, which has no CLUSTER SHARDS
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []slotRange
	for _, s := range slots {
		if len(s.Nodes) > 0 { // the first is the master
			out = append(out, slotRange{int64(s.Start), int64(s.End), s.Nodes[0].Addr})
		}
	}
	return out, nil
}

// newSlotTable builds a table from ranges. Names of old are reused, so a
// name's string is the same from one load to the next.
func newSlotTable(ranges []slotRange, old *slotTable) *slotTable {
	t := new(slotTable)
	index := map[string]uint16{}
	for _, r := range ranges {
		if r.start < 0 || r.end >= clusterSlots || r.start > r.end {
			continue
		}
		i, ok := index[r.addr]
		if !ok {
			name := masterName(r.addr)
			if old != nil {
				for _, n := range old.names {
					if n == name {
						name = n
						break
					}
				}
			}
			t.names = append(t.names, name)
			i = uint16(len(t.names))
			index[r.addr] = i
		}
		for slot := r.start; slot <= r.end; slot++ {
			t.master[slot] = i
		}
	}
	return t
}

// settle runs try, and again while it fails because the key's slot is
// moving (slotMoving) and the call's deadline leaves time for another try,
// waiting 1, 2, 4, then 8 ms between tries. Each such reply was given
// before a script ran (Redis checks a command's slot before running it),
// so a try again never counts twice. A try that runs out of time after
// the slot was found moving fails as the slot's condition too: its error
// holds both, and so it is the key's failure, never its master's.
func (m *masters) settle(ctx context.Context, try func(context.Context) error) error {
	err := try(ctx)
	if err == nil || !slotMoving(err) {
		return err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(slotPatience)
	}
	for wait := firstSlotWait; ; wait = min(2*wait, maxSlotWait) {
		m.stale.Store(true) // the slot's master may have changed
		if time.Until(deadline) < 2*wait {
			return err
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-timer.C:
		}
		next := try(ctx)
		switch {
		case next == nil:
			return nil
		case slotMoving(next):
			err = next
		case ctx.Err() != nil:
			return fmt.Errorf("%w (tried again until the deadline: %w)", err, next)
		default:
			return next
		}
	}
}

// runSettled is run (a lease's script), on a Cluster tried again while the
// key's slot is moving (settle).
func (s *shard) runSettled(ctx context.Context, script *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	if s.cluster == nil {
		return s.run(ctx, script, keys, args...)
	}
	s.cluster.maybeLoad()
	var cmd *goredis.Cmd
	err := s.cluster.settle(ctx, func(ctx context.Context) error {
		cmd = s.run(ctx, script, keys, args...)
		return cmd.Err()
	})
	if err != nil {
		cmd.SetErr(err)
	}
	return cmd
}

// slotMovingPrefixes begin the replies of a Cluster node about one slot in
// a move: a multi-key command whose keys are split by the move (TRYAGAIN),
// redirections go-redis stopped following (its MaxRedirects), and a slot
// that no node serves.
var slotMovingPrefixes = []string{"TRYAGAIN", "ASK ", "MOVED ", "CLUSTERDOWN Hash slot not served"}

// slotMoving reports whether err is a Cluster's answer about the key's slot
// alone (slotMovingPrefixes), which never says anything of its master.
func slotMoving(err error) bool {
	var re goredis.Error
	if !errors.As(err, &re) {
		return false
	}
	for _, p := range slotMovingPrefixes {
		if strings.HasPrefix(re.Error(), p) {
			return true
		}
	}
	return false
}

// keySlot is the Cluster slot of storage key sk, by Redis's rule: the CRC16
// of the hash tag (what lies between the first '{' and the next '}', when
// that is not empty), else of the whole key.
func keySlot(sk string) uint16 {
	if i := strings.IndexByte(sk, '{'); i >= 0 {
		if j := strings.IndexByte(sk[i+1:], '}'); j > 0 {
			sk = sk[i+1 : i+1+j]
		}
	}
	return crc16(sk) % clusterSlots
}

// hashSlot is the Cluster slot of a storage key whose hash is h (see
// identityKey: the tag is 16 hex digits of h, after 'k' with TagByKey),
// without building the key.
func hashSlot(h uint64, byKey bool) uint16 {
	var buf [17]byte
	tag := buf[:0]
	if byKey {
		tag = append(tag, keyTagMark)
	}
	const hexDigits = "0123456789abcdef"
	for i := 0; i < 16; i++ {
		tag = append(tag, hexDigits[(h>>(60-4*i))&0xf])
	}
	var c uint16
	for _, b := range tag {
		c = c<<8 ^ crc16Table[byte(c>>8)^b]
	}
	return c % clusterSlots
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), Redis Cluster's
// key hash.
func crc16(s string) uint16 {
	var c uint16
	for i := 0; i < len(s); i++ {
		c = c<<8 ^ crc16Table[byte(c>>8)^s[i]]
	}
	return c
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
